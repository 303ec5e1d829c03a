"""CI glue: what the workflows' hosted jobs do, kept here so it runs, and is tested, anywhere.

    ids.py          stable keys, the hidden markers that carry them, timestamps
    history.py      the `distci-data` branch: the JSONL history, append-only
    regressions.py  tonight's regressions, their bisect plans, infra runs for missing cells
    issues.py       one issue per error signature, occurrences as comments, bisect dispatches
    nightly.py      the aggregate as explicit steps (collect -> record -> judge -> publish -> file)
    actions.py      Actions glue: run URL, $GITHUB_OUTPUT, the step summary, a cell's runner
    command.py      `python -m distci aggregate nightly|bisect-result|stack|cell`

The package face imports nothing: importing `distci.ci.actions` loads no GitHub client.
"""
