"""`inferris-dist html WIRELOG -o FILE`: a wire log drawn as one self-contained page (inferris_dist/page)."""
from __future__ import annotations

from inferris_dist.cli.args import EXIT_OK


def add_arguments(htm) -> None:
    htm.add_argument("wirelog", metavar="WIRELOG", help="a file written by launch --wire-log")
    htm.add_argument("-o", "--output", required=True, metavar="FILE", help="the page to write")
    htm.add_argument("--title", help="the page's title (default: the run's name)")


def main(args) -> int:
    from inferris_dist.page import write_page
    write_page(args.wirelog, args.output, args.title)
    return EXIT_OK
