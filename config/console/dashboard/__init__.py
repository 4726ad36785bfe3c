"""The researchers' evaluation dashboard at /dashboard/.

``data`` loads what a page needs (one ``ProjectData`` per request); ``tabs/`` holds one
module per page (the Labels page has two: labels, annotators), each building `Panel`s (a
table plus a chart spec drawn from the same rows); ``specs`` are the chart specs, the
contract with ``static/dashboard/charts/*.js``; ``csv_export`` writes a panel's CSV;
``views`` and ``urls`` serve them.
"""
