"""Figures of the inference study: none of its own. Its ranking is a table (``data/inference/ranking.csv``, shown in
docs/dynamics.md and the report); the runs it validates with are drawn by the dynamics study. A figure of the ranking
would be drawn here, from ``aggregate``'s tables, as the other studies' ``figures`` modules do."""
