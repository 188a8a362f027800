"""Run staging: a run writes into a staging folder of its own and is published whole when
complete (``run_folder``), interrupted runs kept apart and marked (``interrupt``), and the
steps of one staged ``hil run`` (``staged_run``)."""
