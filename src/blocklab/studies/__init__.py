"""The studies, one package each and one shape (studies/README.md): ``plan``, ``run``, ``aggregate``, ``figures`` and
``commands``, plus what they share (``cells``: the settings and run names; ``family``: the paths and the command line)."""
