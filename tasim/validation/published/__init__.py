"""Published measurements as data, and holding tasim against them.

``measurements/*.yaml`` hold what sources published (the ThunderAgent paper, the verl recipe's
H20 results), one file per source, every value with its citation. Modules: `measurement_file`
(the file format and its one-line errors), `quantities` (the catalogue a point's ``metric``
names, each a function of one run), `turn_latency` (the one metric folded from events), `runs`
(one simulation as the metrics read it), `evaluate` (which runs the points need, running them,
tasim's value of each point: the library ``tasim calibrate`` builds on), `published_record`
(``published.json``), `present`, `table`, `document` and `figures` (how results are shown) and
`against_published` (``python -m tasim validate published``)."""
