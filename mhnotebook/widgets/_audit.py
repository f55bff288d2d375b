"""The audit's view: what `multihost run --audit` found, one row per finding.

`AuditView` draws a `multihost.AuditReport`: a banner (how many launches were audited,
how many findings), then a table: the check, the launch and its call number (the step it
was found at), the call site, the argument path, the processes it names (each in its host
colour) and the rest of the line. A pure function of its model, with the report's own text
as the plain-text form.
"""

from __future__ import annotations

import ipywidgets as widgets

from mhnotebook.widgets._common import View, add_classes, banner, esc, expect_model, odd_host
from multihost._models import AuditReport
from multihost._models._audit import CHECK_WORDS
from multihost._text import fmt_hosts, short_site

#: Findings listed in the table; more are counted.
MAX_ROWS = 100


def audit_table_html(report: AuditReport, max_rows: int = MAX_ROWS) -> str:
    """The findings, one row each, in the order they were found."""
    if not report.findings:
        return ''
    rows = []
    for f in report.findings[:max_rows]:
        hosts = ' '.join(odd_host(p, str(p)) for p in f.processes[:16])
        if len(f.processes) > 16:
            hosts += f' … ({len(f.processes)} in all)'
        rows.append(
            f'<tr class="mh-audit-row mh-audit-{esc(f.check)}">'
            f'<td>{esc(CHECK_WORDS.get(f.check, f.check))}</td>'
            f'<td><code>{esc(f.launch)}</code> #{f.call}</td>'
            f'<td><small>{esc(short_site(f.site))}</small></td>'
            f'<td><code>{esc(f.path)}</code></td><td>{hosts}</td>'
            f'<td>{esc(f.detail)}</td></tr>'
        )
    more = (
        f'<tr><td colspan="6">… {len(report.findings) - max_rows} more findings</td></tr>'
        if len(report.findings) > max_rows
        else ''
    )
    return (
        '<table class="mh-audit-table mh-table"><tr><th>check</th><th>launch, call</th>'
        '<th>site</th><th>argument</th><th>processes</th><th>what</th></tr>'
        f'{"".join(rows)}{more}</table>'
    )


class AuditView(View):
    """A `multihost.AuditReport`: the audit's findings as a table.

    Stable CSS classes: ``mh-audit`` (the view), ``mh-audit-summary``,
    ``mh-audit-table`` (rows ``mh-audit-row`` and ``mh-audit-<check>``, processes
    ``mh-odd-host``).
    """

    def __init__(self, report: AuditReport):
        expect_model('AuditView', report, AuditReport, 'multihost.audit_report() in a process')
        self.report = report
        if not report.enabled:
            head = banner(
                'the job runs without the audit: start it with multihost run --audit', 'mh-info'
            )
        elif report.ok:
            head = banner(
                f'audit: {report.audited} launch(es) audited, nothing found'
                + (f'; stopped: {esc(report.stopped)}' if report.stopped else ''),
                'mh-ok',
            )
        else:
            named = sorted({p for f in report.findings for p in f.processes})
            head = banner(
                f'audit: {len(report.findings)} finding(s) in {report.audited} audited '
                f'launch(es); named: {esc(fmt_hosts(named))}'
                + (f'; stopped: {esc(report.stopped)}' if report.stopped else ''),
                'mh-flagged',
            )
        parts = [
            add_classes(widgets.HTML(head), 'mh-audit-summary'),
            add_classes(widgets.HTML(audit_table_html(report)), 'mh-audit-table-box'),
        ]
        self.widget = add_classes(widgets.VBox(parts), 'mh-audit')

    def text(self) -> str:
        return self.report.format()
