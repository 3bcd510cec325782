"""Transformer Geometry Observatory."""
