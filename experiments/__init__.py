"""dpfy's paper reproductions: not part of the installed package.

Each folder is one reproduction with its README (the command, the machine, the date, every
change from the paper and the results) and its ``results/``. Run them from the root of a
checkout with ``python -m experiments NAME`` after ``pip install -r experiments/requirements.txt``.
"""
