"""`moetune report`: a tune's summary again, from its save dir, as text, JSON and one HTML page.

    data    save dir -> `ShapeReport`s: from ``summary.json`` (what the tune kept),
            else rebuilt from the results store and the written engine files,
            saying what is missing; shapes of several save dirs compared
    text    the tables printed on stdout
    plots   time per batch size, log-log (matplotlib, imported only there)
    page    the self-contained HTML page, its plots embedded and also written as PNGs

Nothing here needs a GPU, torch or triton.
"""
