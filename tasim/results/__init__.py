"""Results: the fold of an event log into a run's summary (`metrics`), intervals over seeds
(`stats`), the event log's files (`eventlog`), a run folder's files and summary (`run_folder`),
tables for the terminal (`render`) and generated sections of markdown documents (`doc_section`).

May import: `tasim.core`, `tasim.config`.
"""
