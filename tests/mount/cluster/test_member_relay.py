"""A cluster mount's member relays its service's log (mount/cluster/member.py ``_Service.relay``):
the line a service writes last (why it unmounted) reaches the member's output even when the
service, ending cleanly, removes its log before the member's next look: the member reads through
the log it holds open. Issue 51: the Ctrl-C test missed one node's "interrupted ... unmounting"
under load, the service's log gone before its member read it. Control: a member that had not yet
opened the log finds nothing once it is removed."""

from __future__ import annotations

import io

from clairvoyant.mount.cluster import member


def test_the_last_line_of_a_service_that_removed_its_log_is_relayed(tmp_path):
    log = tmp_path / "service.log"
    log.write_text("clairvoyant: mounted\n")
    seen = member._Service(1, str(tmp_path / "ctl"), str(log), None)
    late = member._Service(1, str(tmp_path / "ctl"), str(log), None)
    out = io.StringIO()
    seen.relay(out)
    with open(log, "a") as f:   # the service's last words, then its clean end removes the log
        f.write("clairvoyant: node 0: interrupted at the launcher (Ctrl-C); unmounting\n")
    log.unlink()
    seen.relay(out)
    seen.close()
    assert out.getvalue().splitlines() == ["clairvoyant: mounted",
                                           "clairvoyant: node 0: interrupted at the launcher (Ctrl-C); unmounting"]
    missed = io.StringIO()
    late.relay(missed)   # control: by path, after the removal, nothing is left to read
    assert missed.getvalue() == ""
