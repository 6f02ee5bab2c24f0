"""Tools and document generators run by `make` targets from the checkout; not part of the
installed package (the wheel does not ship it), and nothing in ``tasim/`` may import it."""
