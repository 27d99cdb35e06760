#!/bin/sh
# MaxText stopped after 10 steps and started again: the second start finds the run's checkpoints in
# maxtext_output/resume/, restores step 9 and trains steps 10 to 19. Run: sh run.sh
# The first start begins from nothing: a previous run's checkpoints in this folder would be restored instead.
set -e
rm -rf maxtext_output/resume
python -m maxtext.trainers.pre_train.train resume.yml steps=10
python -m maxtext.trainers.pre_train.train resume.yml
