"""The drawing stage: a pipeline drawn from its model, as the PNG (``leapp.drawing.png``,
``<graph>.png``) and as the interactive HTML page (``leapp.drawing.html``, ``<graph>.html``)."""
