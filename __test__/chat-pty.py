"""Drives `mlx-bun chat` through a pseudo-terminal, as a person types (cli.test.js runs it;
Node has no pty of its own). Usage: chat-pty.py COMMAND ARGS... ; prints one JSON object:
{"exit": code, "transcript": what the terminal showed}. Every step waits for what the screen
must show next (never a fixed sleep), and fails with the transcript so far if it does not come.
"""
import json
import os
import pty
import re
import select
import sys
import time

pid, fd = pty.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])

screen = b""


def wait_for(pattern, what, since=0, timeout=60):
    """Reads until `pattern` shows up in what the terminal showed from offset `since` on."""
    global screen
    end = time.time() + timeout
    while not re.search(pattern, screen[since:]):
        if time.time() > end:
            sys.exit(f"no {what} within {timeout} s; the terminal showed {screen!r}")
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                data = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                data = b""
            if not data:
                sys.exit(f"chat ended before {what}; the terminal showed {screen!r}")
            screen += data


wait_for(rb">>> ", "first prompt")
# A typo mended with the line editor: three steps left, two backspaces, then the right letters.
os.write(fd, b"What is the capital of Frnace?\x1b[D\x1b[D\x1b[D\x7f\x7fan\r")
wait_for(re.compile(rb"TTFT \d+ ms\r\n.*>>> ", re.S), "first answer")
# Up arrow recalls that line from the history; Ctrl-U clears it for a new message.
mark = len(screen)
os.write(fd, b"\x1b[A")
wait_for(rb"France\?", "the recalled line", mark)
mark = len(screen)
os.write(fd, b"\x15Tell me a long story about a cat.\r")
# Ctrl-C once the answer has begun (a few characters on the line after the message) stops that
# answer, not the chat.
wait_for(rb"cat\.[^\n]*\n[^\r\n]{3}", "the story's first words", mark)
mark = len(screen)
os.write(fd, b"\x03")
wait_for(re.compile(rb"answer stopped.*>>> ", re.S), "the prompt after Ctrl-C", mark)
os.write(fd, b"/exit\r")
end = time.time() + 30
while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    if time.time() > end:
        os.kill(pid, 9)
        sys.exit(f"chat still running 30 s after /exit; the terminal showed {screen!r}")
    try:
        if select.select([fd], [], [], 0.1)[0]:
            screen += os.read(fd, 4096)
    except OSError:
        time.sleep(0.1)
print(json.dumps({"exit": os.waitstatus_to_exitcode(status), "transcript": screen.decode(errors="replace")}))
