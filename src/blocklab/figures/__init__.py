"""The figures of the two documents and of the lab's gallery page: one small plotting function per figure, each taking
tidy data frames and returning a matplotlib Figure (``doc000``, ``doc004``, ``params``: document 004's parameter
counts, ``residual_trained``: problem 10 (c), ``lab``), and ``style``, which every figure of the project uses.

A study's figures are not here: a study is one package of five modules by design (``studies/<study>/figures.py``,
src/blocklab/studies/README.md), and its figures import ``style`` and the shared labels from this package."""
