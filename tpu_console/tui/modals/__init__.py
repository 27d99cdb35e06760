"""Dialogs over a screen: help, create, delete, launch, confirm, compare."""
