"""How a conformance run is told: an aligned table line per case, JSON, and JUnit XML (the
testsuite/testcase/failure/skipped elements CI systems read)."""
from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from typing import Sequence

from inferris_dist.conform.cases import FAIL, INFORMATIONAL, NON_STRICT, SKIPPED
from inferris_dist.conform.runner import Result, summary

ID_WIDTH = 34
DETAIL_WIDTH = 110


def _one_line(text: str, width: int = DETAIL_WIDTH) -> str:
    text = " ".join(str(text).split())
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= width else text[:width - 3] + "..."


def row(r: Result) -> str:
    """One case, aligned: id and section, grade, seconds, what happened."""
    lines = [f"{r.case.title:<{ID_WIDTH}} {r.grade:<13} {r.seconds:6.2f}s  {_one_line(r.detail)}"]
    if r.grade == FAIL:
        lines.append(f"{'':<{ID_WIDTH}}   again: {r.reproduce}")
        if r.wire_log is not None:
            lines.append(f"{'':<{ID_WIDTH}}   wire log: {r.wire_log}")
    return "\n".join(lines)


def as_json(results: Sequence[Result], seconds: float, keep: str) -> str:
    return json.dumps({
        "summary": summary(results), "seconds": round(seconds, 3), "kept": keep,
        "cases": [{"id": r.case.id, "section": r.case.section, "grade": r.grade, "required": r.case.required,
                   "seconds": round(r.seconds, 3), "detail": r.detail,
                   "wire_log": str(r.wire_log) if r.wire_log else None,
                   "reproduce": r.reproduce if r.grade == FAIL else None} for r in results]}, indent=1)


_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_text(text: str) -> str:
    """`text` with what XML 1.0 cannot hold (a worker's last words may have anything) shown as
    escapes: the file stays well-formed."""
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def junit(results: Sequence[Result], seconds: float) -> bytes:
    suite = ET.Element("testsuite", name="inferris-dist conform", tests=str(len(results)),
                       failures=str(sum(1 for r in results if r.grade == FAIL)), errors="0",
                       skipped=str(sum(1 for r in results if r.grade == SKIPPED)), time=f"{seconds:.3f}")
    for r in results:
        case = ET.SubElement(suite, "testcase", classname=f"conform.{r.case.id.split('.')[0]}",
                             name=r.case.title, time=f"{r.seconds:.3f}")
        if r.grade == FAIL:
            failure = ET.SubElement(case, "failure", message=_one_line(r.detail, 400), type="FAIL")
            failure.text = _xml_text(f"{r.detail}\nagain: {r.reproduce}\nwire log: {r.wire_log or '-'}")
        elif r.grade == SKIPPED:
            ET.SubElement(case, "skipped", message=_xml_text(r.detail))
        elif r.grade in (NON_STRICT, INFORMATIONAL):
            out = ET.SubElement(case, "system-out")
            out.text = _xml_text(f"{r.grade}: {r.detail}")
    return ET.tostring(suite, encoding="utf-8", xml_declaration=True)
