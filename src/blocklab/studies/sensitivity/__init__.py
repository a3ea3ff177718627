"""The sensitivity study: what document 000 leaves open (``plan``, ``run``, ``aggregate``, ``figures``, ``commands``)."""
