"""The dynamics study: why post-norm fails, measured while it trains (``plan``, ``run``, ``aggregate``, ``figures``,
``commands``)."""
