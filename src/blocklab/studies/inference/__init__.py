"""The inference study: the document's unstated setup, inferred from fitting runs (``plan``, ``run``, ``aggregate``,
``figures``, ``commands``)."""
