"""Reads frames of any size: it sets no cap on its socket (and decodes whatever comes)."""
import sys

from _base import main, wire

wire.MAX_FRAME_BYTES = 1 << 30
sys.exit(main())
