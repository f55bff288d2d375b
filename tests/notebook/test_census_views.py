"""Census views from synthetic models (no cluster): what they say and draw."""

from __future__ import annotations

import pytest

from mhnotebook.widgets import EnvView, MemoryView, render_memory_png
from multihost import EnvDiff, MemoryCensus
from multihost._checks._census import ArrayGroup, DeviceMemory, HostMemory, _entry

MIB = 1 << 20


def _env() -> EnvDiff:
    flags = _entry('env.XLA_FLAGS', {0: '', 1: '--xla_fast', 2: '', 3: ''}, 4)
    worker = _entry('env.TPU_WORKER_ID', {p: str(p) for p in range(4)}, 4)
    return EnvDiff(num_processes=4, entries=(flags,), per_host=(worker,), compared=140)


def test_env_entry_majority_and_odd_hosts():
    e = _env().entries[0]
    assert e.majority == '' and e.odd_processes == (1,)
    assert "env.XLA_FLAGS: '' on most; process 1: '--xla_fast'" == e.describe()


def test_env_view_names_the_odd_host_and_lists_by_design_keys_apart():
    view = EnvView(_env())
    html = view.static_html()
    assert 'mh-env-table' in html and '--xla_fast' in html and 'mh-odd-host' in html
    assert 'differ per process by design' in html and 'TPU_WORKER_ID' in html
    assert view.text().startswith(
        'environments of 4 processes (140 keys compared): 1 key(s) differ'
    )
    same = EnvView(EnvDiff(num_processes=4, entries=(), compared=140))
    assert same.diff.ok and 'identical' in same.static_html() and 'identical' in same.text()


def _census(extra_on: int | None = 3) -> MemoryCensus:
    hosts = []
    for p in range(4):
        extra = 64 * MIB if p == extra_on else 0
        devs = tuple(
            DeviceMemory(id=p * 2 + d, process=p, local=d, live_bytes=4 * MIB + extra // 2)
            for d in range(2)
        )
        hosts.append(
            HostMemory(
                process=p, live_count=3 + (extra > 0), live_bytes=8 * MIB + extra, devices=devs
            )
        )
    only = ()
    if extra_on is not None:
        counts = tuple(1 if p == extra_on else 0 for p in range(4))
        only = (ArrayGroup((16, 1024, 1024), 'float32', 'P()', counts, 64 * MIB, ('cache',)),)
    return MemoryCensus(hosts=tuple(hosts), only_some=only)


def test_memory_census_odd_host_and_view():
    census = _census()
    assert census.heavy_processes == (3,) and census.odd_processes == (3,)
    assert census.only_some[0].extra_processes == (3,)
    view = MemoryView(census)
    html = view.static_html()
    assert 'process 3 stands out' in html and 'data:image/png' in html
    assert 'mh-mem-leaks' in html and 'cache' in html and 'float32[16, 1024, 1024]' in html
    assert 'not reported by this backend' in html
    assert 'only some processes hold float32[16, 1024, 1024] P() (cache)' in view.text()
    assert render_memory_png(census)[:8] == b'\x89PNG\r\n\x1a\n'
    clean = _census(None)
    assert clean.odd_processes == () and 'no process stands out' in MemoryView(clean).static_html()


def _census_1000(stats: bool) -> MemoryCensus:
    """1,000 hosts x 8 devices, 8 MiB of live arrays each, but hosts 17 and 503 hold 72 MiB (a
    64 MiB cache only they keep) and hosts 600-639 each another number of arrays; with
    ``stats``, device 0 of each of processes 600-639 has another figure in use."""
    hosts = []
    for p in range(1000):
        extra = 64 * MIB if p in (17, 503) else 0
        devs = []
        for d in range(8):
            live = MIB + extra // 8
            busy = live + ((p - 599) * MIB // 10 if 600 <= p < 640 and d == 0 else 0)
            figures = dict(in_use=busy, peak=busy + MIB, limit=16 << 30) if stats else {}
            devs.append(DeviceMemory(id=p * 8 + d, process=p, local=d, live_bytes=live, **figures))
        count = 3 + (p in (17, 503)) + (p if 600 <= p < 640 else 0)
        hosts.append(
            HostMemory(process=p, live_count=count, live_bytes=8 * MIB + extra, devices=tuple(devs))
        )
    counts = tuple(1 if p in (17, 503) else 0 for p in range(1000))
    only = (ArrayGroup((16, 1024, 1024), 'float32', 'P()', counts, 64 * MIB, ('cache',)),)
    return MemoryCensus(hosts=tuple(hosts), only_some=only, stats_available=stats)


@pytest.mark.parametrize('stats', [False, True], ids=['cpu', 'memory_stats'])
def test_memory_census_text_is_bounded_at_1000_hosts(stats):
    """Hosts (and devices) with the same line are grouped, at most 16 lines of each, the rest
    counted: under 40 lines of bounded length that still name hosts 17 and 503."""
    census = _census_1000(stats)
    assert census.odd_processes == (17, 503)
    text = census.format()
    lines = text.splitlines()
    assert len(lines) < 40 and max(map(len, lines)) < 200, (len(lines), text)
    assert lines[0].endswith('odd: processes 17, 503')
    assert lines[1] == '  processes 0-16, 18-502, 504-599, 640-999: 3 arrays, 8.0 MiB'
    assert lines[2] == '  processes 17, 503: 4 arrays, 72.0 MiB <-- stands out'
    assert lines[3] == '  process 600: 603 arrays, 8.0 MiB'
    assert '  ... and 27 more processes (27 other lines), 8.0 MiB each' in lines
    assert 'each: 1 on processes 17, 503; 0 on processes 0-16, 18-502, 504-999' in lines[-1]
    if stats:  # 8000 devices in a few lines: figures as median and range, outliers grouped
        assert lines[17] == (
            '  device memory of 8000 devices: in use median 1.0 MiB (1.0 MiB to 9.0 MiB), '
            'peak median 2.0 MiB (2.0 MiB to 10.0 MiB), limit 16384.0 MiB'
        )
        assert lines[18].startswith('  headroom (limit - peak) least 16374.0 MiB on process 17')
        assert lines[19] == (
            '  stand out by in use: 46 devices of processes 17, 503, 610-639, '
            '2.1 MiB to 9.0 MiB (median 1.0 MiB)'
        )
        assert lines[20].startswith('  stand out by peak: 46 devices of processes 17, 503, 610-639')
        assert 'WARNING' not in text
    assert MemoryView(census).text() == text  # what %mh_memory_census shows as text


def test_census_views_reject_wrong_models():
    with pytest.raises(TypeError, match='multihost.EnvDiff.*got builtins.dict'):
        EnvView({})
    with pytest.raises(TypeError, match='multihost.MemoryCensus.*got builtins.list'):
        MemoryView([])


def test_heatmap_labels_never_read_a_small_value_as_zero(tmp_path):
    """0.27 MiB reads '0.27', not '0'; the cells' labels are the ones drawn."""
    import os

    from mhnotebook.widgets._census import heatmap_cells, mib_label

    assert [mib_label(v) for v in (0, 0.004, 0.27, 3.46, 512.4)] == [
        '0',
        '<0.01',
        '0.27',
        '3.5',
        '512',
    ]
    small = int(0.27 * MIB)
    devs = tuple(
        DeviceMemory(id=d, process=0, local=d, live_bytes=small * (d + 1)) for d in range(2)
    )
    census = MemoryCensus(
        hosts=(HostMemory(process=0, live_count=2, live_bytes=3 * small, devices=devs),)
    )
    assert [mib_label(v) for v in heatmap_cells(census)[0]] == ['0.27', '0.54']
    png = render_memory_png(census)
    path = os.environ.get('MH_SAVE_MEM_PNG') or str(tmp_path / 'mem.png')
    with open(path, 'wb') as f:
        f.write(png)
    import matplotlib.image

    assert matplotlib.image.imread(path).shape[2] in (3, 4)


def test_memory_view_at_1000_hosts_shows_the_hosts_that_stand_out_first():
    """1,000 hosts: the odd ones (beyond the first 64) come first, the rest grouped, one screen."""
    from mhnotebook.widgets._census import MAX_HEAT_ROWS, memory_html, rest_groups, shown_hosts

    def host(p: int) -> HostMemory:
        extra = {717: 512 * MIB, 950: 64 * MIB}.get(p, 0) + (MIB // 4 if 300 <= p < 400 else 0)
        devs = tuple(
            DeviceMemory(id=p * 2 + d, process=p, local=d, live_bytes=4 * MIB + extra // 2)
            for d in range(2)
        )
        return HostMemory(process=p, live_count=3, live_bytes=8 * MIB + extra, devices=devs)

    counts = tuple(1 if p in (717, 950) else 0 for p in range(1000))
    census = MemoryCensus(
        hosts=tuple(host(p) for p in range(1000)),
        only_some=(ArrayGroup((16, 1024, 1024), 'float32', 'P()', counts, 64 * MIB, ('c',)),),
    )
    shown = shown_hosts(census)
    assert [h.process for h in shown[:2]] == [717, 950], [h.process for h in shown[:4]]
    assert len(shown) == MAX_HEAT_ROWS // 2
    rest = rest_groups(census)
    assert len(rest) <= 9
    drawn = {h.process for h in shown}
    assert rest == [
        ('processes 0-299, 400-716, 718-949, 951-999', '898 processes, 8.0 MiB, 3 arrays'),
        ('processes 330-399', '70 processes, 8.2 MiB, 3 arrays'),
    ]
    # every host is either drawn or in a group row, and the group rows count them all
    grouped = sum(int(what.split(' processes')[0]) for _, what in rest)
    assert grouped + len(drawn) == 1000, rest
    html = memory_html(census)
    assert html.count('<tr') <= 1 + MAX_HEAT_ROWS // 2 + 9
    assert html.index('process 717') < html.index('process 950') < html.index('mh-mem-rest')
    assert 'processes 717, 950: 1' in html
    png = render_memory_png(census)
    assert png.startswith(b'\x89PNG')


def _census_near_limit():
    """16 hosts x 4 TPU v5e chips; chip 2 of host 9 peaks at 15.5 of 16 GiB, fragmented."""
    gib = 1 << 30
    hosts = []
    for p in range(16):
        devs = []
        for d in range(4):
            hot = (p, d) == (9, 2)
            devs.append(
                DeviceMemory(
                    id=p * 4 + d,
                    process=p,
                    local=d,
                    live_bytes=gib,
                    in_use=(15 if hot else 2) * gib,
                    peak=int((15.5 if hot else 3) * gib),
                    limit=16 * gib,
                    largest_free=(gib // 4) if hot else 12 * gib,
                    padded_bytes=gib + gib // 8,
                    kind='TPU v5 lite',
                    coords=(d % 2 + 2 * (p % 2), d // 2, 0),
                )
            )
        hosts.append(HostMemory(process=p, live_count=1, live_bytes=4 * gib, devices=tuple(devs)))
    return MemoryCensus(hosts=tuple(hosts), stats_available=True)


def test_memory_census_hbm_headroom_free_block_padding_and_warning():
    """64 TPU chips: one near its limit (a warning naming it), fragmentation (the smallest
    largest free block and where), padded against logical bytes, outliers grouped."""
    gib = 1 << 30
    census = _census_near_limit()
    hosts = census.hosts
    text = census.format()
    lines = text.splitlines()
    assert len(lines) < 30, text
    assert '  device memory of 64 devices (TPU v5 lite): in use median 2048.0 MiB' in text
    assert (
        'headroom (limit - peak) least 512.0 MiB on process 9 · dev 2 (id 38) chip (2,1,0); '
        'largest free block smallest 256.0 MiB on process 9 · dev 2 (id 38) chip (2,1,0)'
    ) in text
    assert '  live arrays on device: 73728.0 MiB with padding, 65536.0 MiB logical (+12%)' in text
    assert '  stand out by in use: process 9 · dev 2 (id 38) chip (2,1,0), 15360.0 MiB' in text
    assert '  WARNING: peak within 10% of the limit on process 9 · dev 2 (id 38)' in text
    assert census.near_limit() == (hosts[9].devices[2],)
    assert hosts[9].devices[2].headroom == gib // 2
    assert not any(line.startswith('  process 0 · dev') for line in lines)  # no line per chip


def test_memory_view_shows_device_memory_and_the_warning():
    census = _census_near_limit()
    html = MemoryView(census).static_html()
    assert html.count('class="mh-mem-hbm-line') == len(census.hbm_lines())
    assert 'mh-mem-near-limit' in html and 'WARNING: peak within 10% of the limit' in html


def test_env_census_holds_megascale_and_a_slice_id_is_per_host_by_design(monkeypatch):
    from multihost._checks import _census

    monkeypatch.setenv('MEGASCALE_NUM_SLICES', '2')
    monkeypatch.setenv('MEGASCALE_SLICE_ID', '1')
    env = _census.environment()
    assert env['env.MEGASCALE_NUM_SLICES'] == '2' and env['env.MEGASCALE_SLICE_ID'] == '1'
    assert _census._BY_DESIGN.search('env.MEGASCALE_SLICE_ID')
    assert not _census._BY_DESIGN.search('env.MEGASCALE_NUM_SLICES')  # must agree everywhere
