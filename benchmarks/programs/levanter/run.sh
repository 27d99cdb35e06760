#!/bin/sh
# Levanter's train_lm on CPU: a 2-layer GPT-2 (hidden 32) on word-counting text, 20 steps, an eval every 10.
# prepare.py makes the tokenizer and the data offline; Levanter itself is used as installed. Run: sh run.sh
set -e
python prepare.py
python -m levanter.main.train_lm --config_path tiny.yaml
