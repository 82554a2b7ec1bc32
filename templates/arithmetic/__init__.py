"""Arithmetic template: synthetic questions at five difficulty levels, seeded by index."""
