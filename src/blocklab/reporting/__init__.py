"""Reporting: claims vs measurements, the answers to the documents' problems, the analysis report, the gallery, and
the headless-browser check of the report."""
