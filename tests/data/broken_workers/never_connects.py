"""Reads its secret, then never connects."""
import sys
import time

from _base import note_pid

note_pid()
sys.stdin.readline()
time.sleep(600)
