"""Differentiable ops, one small Node class per op, grouped by kind."""
