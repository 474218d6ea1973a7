"""The HTTP layer gridstatus uses, served from recordings: ``requests`` through the
`responses` library (gridstatus fetches fixed public URLs with module-level requests.get)
and ``urllib`` through an installed opener (``pandas.read_csv(url)``, which MISO's reader
uses). `serve_iso_days` answers the recorded day of each ISO and a gap for any other day,
the way each publisher answers a day it has not published."""

from __future__ import annotations

import io
import json
import re
import urllib.error
import urllib.request
import urllib.response
import zipfile
from email.message import Message
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.signals.server import recorded

CAISO_REPORT = "https://www.caiso.com/documents/daily-renewable-report-{slug}.html"
OASIS = re.compile(r"https://oasis\.caiso\.com/oasisapi/SingleZip\?.*")
NYISO_DAM = (
    "https://oasis-postings.prod.nysdi.com/DAM_LBMP_ZONE/CSV/2024/03/10/damlbmp_zone-20240310.csv"
)
NYISO_ANY = re.compile(r"https://oasis-postings\.prod\.nysdi\.com/DAM_LBMP_ZONE/CSV/.*")
MISO_DAM = "https://docs.misoenergy.org/marketreports/20240310_da_expost_lmp.csv"
SPP_DAM = (
    "https://portal.spp.org/file-browser-api/download/da-lmp-by-settlement-location"
    "?path=/2024/03/By_Day/DA-LMP-SL-202403100100.csv"
)
PJM_LMPS = re.compile(r"https://api\.pjm\.com/api/v1/da_hrl_lmps.*")
PJM_PNODES = re.compile(r"https://api\.pjm\.com/api/v1/pnode.*")
PJM_KEY = "pjm-key-7c1f0e93"
ISONE_COOKIE_PAGE = "https://www.iso-ne.com/isoexpress/web/reports/operations/-/tree/gen-fuel-mix"
ISONE_DAM = re.compile(
    r"https://www\.iso-ne\.com/static-transform/csv/histRpts/da-lmp/"
    r"WW_DALMP_ISO_(\d{8})\.csv"
)
ERCOT_LIST = re.compile(
    r"https://www\.ercot\.com/misapp/servlets/IceDocListJsonWS"
    r"\?reportTypeId=(\d+)&.*"
)
ERCOT_DOC = "https://www.ercot.com/misdownload/servlets/mirDownload?doclookupId={}"
ERCOT_DAM_DOC = ERCOT_DOC.format("991302210")  # DAM prices for 2024-03-11, out 03-10
ERCOT_POINTS_DOC = ERCOT_DOC.format("990871655")  # the settlement points list
OASIS_HEADERS = {"Content-Disposition": "inline; filename=PRC_LMP_DAM_v12_csv.zip;"}


def oasis_zip(csv_name: str) -> bytes:
    """OASIS answers a query with a zip holding the CSV."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(csv_name.replace(".csv", "_v12.csv"), recorded(csv_name))
    return buf.getvalue()


def zipped(name: str, inner: str) -> bytes:
    """A recorded file inside a zip, as ERCOT's MIS serves documents."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(inner, recorded(name))
    return buf.getvalue()


def oasis_no_data() -> bytes:
    """OASIS' answer for a day it has no data for: a zip holding an XML error document."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(
            "INVALID_REQUEST.xml",
            '<?xml version="1.0"?><m:OASISReport '
            'xmlns:m="http://www.caiso.com/soa/OASISReport_v1.xsd"><m:ERR_CODE>1000'
            "</m:ERR_CODE><m:ERR_DESC>No data returned for the specified selection"
            "</m:ERR_DESC></m:OASISReport>",
        )
    return buf.getvalue()


def data_miner(name: str, day: str | None = None) -> Any:
    """PJM Data Miner: pages of a recorded answer by ``startRow`` / ``rowCount`` (gridstatus
    checks ``totalRows`` on every page); with `day` (``03/10/2024``), a query for another
    day has no rows."""
    answer = json.loads(recorded(name))

    def page(request: Any) -> tuple[int, dict[str, str], str]:
        query = parse_qs(urlsplit(request.url).query)
        if request.headers.get("Ocp-Apim-Subscription-Key") != PJM_KEY:
            return 401, {}, json.dumps({"statusCode": 401, "message": "Access denied"})
        first, count = int(query["startRow"][0]), int(query["rowCount"][0])
        span = query.get("datetime_beginning_ept", [""])[0]
        items = answer["items"] if day is None or span.startswith(day) else []
        return (
            200,
            {},
            json.dumps({"totalRows": len(items), "items": items[first - 1 : first - 1 + count]}),
        )

    return page


class RecordedUrls(urllib.request.BaseHandler):
    """urllib's side of the HTTP layer: recorded bodies by URL, 404 for any other."""

    handler_order = 100  # before urllib's own HTTPS handler

    def __init__(self, bodies: dict[str, tuple[int, bytes]] | None = None) -> None:
        self.bodies = dict(bodies or {})
        self.seen: list[str] = []

    def https_open(self, req: urllib.request.Request) -> urllib.response.addinfourl:
        self.seen.append(req.full_url)
        status, body = self.bodies.get(req.full_url, (404, b"not found"))
        if status != 200:
            raise urllib.error.HTTPError(req.full_url, status, "recorded", Message(), None)
        headers = Message()
        headers["Content-Type"] = "text/csv"
        response = urllib.response.addinfourl(io.BytesIO(body), headers, req.full_url, status)
        response.msg = "OK"  # type: ignore[attr-defined]
        return response


def serve_iso_days(mock: Any, urls: RecordedUrls) -> None:
    """Every recorded ISO answer of 2024-03-10, and each publisher's gap for other days."""

    def report(request: Any) -> tuple[int, dict[str, str], bytes]:
        if "daily-renewable-report-mar-10-2024.html" in request.url:
            return 200, {}, recorded("caiso_renewables_mar-10-2024.html")
        return 404, {}, b"<html>Page not found</html>"

    def oasis(request: Any) -> tuple[int, dict[str, str], bytes]:
        if "startdatetime=20240310T08:00-0000" in request.url:
            return 200, OASIS_HEADERS, oasis_zip("caiso_oasis_prc_lmp_dam_20240310.csv")
        return (
            200,
            {"Content-Disposition": "inline; filename=INVALID_REQUEST.xml.zip;"},
            (oasis_no_data()),
        )

    def nyiso(request: Any) -> tuple[int, dict[str, str], bytes]:
        if request.url == NYISO_DAM:
            return 200, {}, recorded("nyiso_damlbmp_zone_20240310.csv")
        return 404, {}, b"not found"

    mock.add_callback("GET", re.compile(r"https://www\.caiso\.com/documents/.*"), callback=report)
    mock.add_callback("GET", OASIS, callback=oasis)
    mock.add_callback("GET", NYISO_ANY, callback=nyiso)
    mock.add_callback(
        "GET", PJM_LMPS, callback=data_miner("pjm_da_hrl_lmps_20240310.json", "03/10/2024")
    )
    mock.add_callback("GET", PJM_PNODES, callback=data_miner("pjm_pnode.json"))

    def ercot_list(request: Any) -> tuple[int, dict[str, str], bytes]:
        m = ERCOT_LIST.match(request.url)
        report = m.group(1) if m else ""
        if report in ("12331", "10008"):
            return 200, {}, recorded(f"ercot_doclist_{report}.json")
        return 200, {}, b'{"ListDocsByRptTypeRes": {"DocumentList": []}}'

    def isone(request: Any) -> tuple[int, dict[str, str], bytes]:
        m = ISONE_DAM.match(request.url)
        if m and m.group(1) == "20241103":
            return 200, {"Content-Type": "text/csv"}, recorded("isone_ww_dalmp_iso_20241103.csv")
        # ISO Express answers a day it has not published with an HTML page
        return 200, {"Content-Type": "text/html"}, b"<html>No data</html>"

    mock.get(
        ISONE_COOKIE_PAGE,
        body="<html>ISO Express</html>",
        headers={"Set-Cookie": "isox_token=recorded; Path=/"},
    )
    mock.add_callback("GET", ISONE_DAM, callback=isone)
    mock.add_callback("GET", ERCOT_LIST, callback=ercot_list)
    mock.get(
        ERCOT_POINTS_DOC,
        body=zipped(
            "ercot_settlement_points_20240308.csv", "Settlement_Points_03082024_094906.csv"
        ),
    )
    urls.bodies[ERCOT_DAM_DOC] = (
        200,
        zipped(
            "ercot_dam_spp_20240311.csv",
            "cdr.00012331.0000000000000000.20240310.133009.DAMSPNP4190.csv",
        ),
    )
    urls.bodies[MISO_DAM] = (200, recorded("miso_20240310_da_expost_lmp.csv"))
    urls.bodies[SPP_DAM] = (200, recorded("spp_da_lmp_sl_202403100100.csv"))
