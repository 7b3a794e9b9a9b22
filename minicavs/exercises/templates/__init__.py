"""The exercise templates (copied by ``python -m minicavs.exercises start``)."""
