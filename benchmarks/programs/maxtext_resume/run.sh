#!/bin/sh
# MaxText stopped after 10 steps and started again: the second start finds the run's checkpoints in
# maxtext_output/resume/, restores step 9 and trains steps 10 to 19. Run: sh run.sh
set -e
python -m maxtext.trainers.pre_train.train resume.yml steps=10
python -m maxtext.trainers.pre_train.train resume.yml
