"""Countdown template: reach a target number from given numbers with + - * /."""
