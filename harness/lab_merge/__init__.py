"""The lab merge: result folders from several hosts or shards merged into one report
(``merge``), and the ``hil report --merge`` command over them (``lab_report``)."""
