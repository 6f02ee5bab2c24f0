"""``python -m tasim calibrate``: fit scenario fields to published measurements, and say how well
the fit predicts the points it was not fitted to.

`space` parses what to fit (``--fit key=low:high``); `fit` searches it with Optuna's TPE sampler,
each trial simulating what the fitted points need (`tasim.validation.published.evaluate`); `outcome`
tabulates fitted values, residuals, held-out and leave-one-out errors, and writes the calibrated
scenario as a new file that cites what it was fitted to; `procedure` runs it all.
"""


class CalibrationError(ValueError):
    """A calibration that cannot run as asked; the message is one line for the user."""
