"""What users run on top of the simulator: comparing policies over seeds (`comparison`), tuning a
policy's knobs (`tuning`) with the search engine it shares with calibration (`search`), the
parallel backends that spread runs over processes or Ray (`parallel`) and the plots (`plots`).

May import: `tasim.sim` and every layer below it; never `tasim.live`.
"""
