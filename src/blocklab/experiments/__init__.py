"""The experiments of documents 000 and 004, one module each, each writing its tables under data/ for the figures and
the claims: ``gradnorm`` (the gradient per block at init), ``problem9`` (the students' scores), ``residual_sim``
(problem 10 (a): the stream's length in a random model), ``residual_trained`` (problem 10 (c): the stream in trained
models), ``param_counts``, ``activation_norms``, ``reverse_copy``. The copy-task sweep itself is ``training.sweep``;
the studies, which train many runs each, are ``blocklab.studies``."""
