"""E-mail through the deployment's SMTP relay: one message to one address, its answer as an :class:`Outcome`.

The relay is the administrator's (``SUNDIAL_SMTP_*``), not the tenant's: a tenant names only the recipient, so
there is no address of theirs to check for server-side request forgery, only the address's syntax (one
``local@domain``, no spaces, no CR/LF that could add a header). The connection upgrades with STARTTLS when asked
(certificates verified, against ``SUNDIAL_DELIVERY_CA_BUNDLE`` when set), logs in when credentials are given, and
is bounded by a timeout. ``smtplib`` is blocking, so each message is sent on a worker thread.

The answer maps onto the webhook sender's :class:`~sundial_common.delivery.sender.Outcome`: a 2yz reply is
delivered (its code kept as the status); a 4yz reply or no answer at all (refused, timed out) is transient and
retried; a 5yz reply (an unknown recipient, a message refused) is final.
"""

from __future__ import annotations

import asyncio
import re
import smtplib
import ssl
import time
from dataclasses import dataclass
from email.message import EmailMessage

from sundial_common.delivery.sender import Outcome

__all__ = ["MailRelay", "bad_address", "send_mail"]

_ADDRESS = re.compile(r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")


@dataclass(frozen=True)
class MailRelay:
    """Where and how e-mail leaves: the relay's ``host`` and ``port``, STARTTLS, the sender, credentials."""

    host: str
    port: int = 587
    starttls: bool = True
    sender: str = "sundial@localhost"
    username: str | None = None
    password: str | None = None
    timeout_sec: float = 10.0
    ca_bundle: str | None = None


def bad_address(address: str) -> str | None:
    """Why ``address`` is not one e-mail address a message may go to, or None."""
    if len(address) > 254 or not _ADDRESS.match(address):
        return f"{address!r} is not an e-mail address (local@domain, no spaces)"
    if "." not in address.rsplit("@", 1)[1] and not address.endswith("@localhost"):
        return f"{address!r}: the domain has no dot"
    return None


async def send_mail(relay: MailRelay, to: str, subject: str, body: str, msg_id: str) -> Outcome:
    """Send one plain-text message; ``msg_id`` becomes its ``Message-ID`` (the same for every attempt)."""
    problem = bad_address(to)
    if problem is not None:
        return Outcome(status=None, error=problem, refused=True)
    message = EmailMessage()
    message["From"] = relay.sender
    message["To"] = to
    message["Subject"] = subject.replace("\r", " ").replace("\n", " ")
    message["Message-ID"] = f"<{msg_id}@sundial>"
    message.set_content(body)
    started = time.monotonic()
    try:
        code = await asyncio.to_thread(_send, relay, message)
    except smtplib.SMTPResponseException as exc:
        error = f"SMTP {exc.smtp_code}: {_text(exc.smtp_error)}"
        final = 500 <= exc.smtp_code < 600
        return Outcome(status=exc.smtp_code if final else None, error=error, refused=final, elapsed_sec=_since(started))
    except smtplib.SMTPRecipientsRefused as exc:
        code, reply = next(iter(exc.recipients.values()))
        final = 500 <= code < 600
        error = f"SMTP {code}: {_text(reply)}"
        return Outcome(status=code if final else None, error=error, refused=final, elapsed_sec=_since(started))
    except (smtplib.SMTPException, OSError, ssl.SSLError) as exc:
        return Outcome(status=None, error=f"SMTP relay: {exc!r}", elapsed_sec=_since(started))
    return Outcome(status=code, elapsed_sec=_since(started))


def _send(relay: MailRelay, message: EmailMessage) -> int:
    with smtplib.SMTP(relay.host, relay.port, timeout=relay.timeout_sec) as smtp:
        smtp.ehlo()
        if relay.starttls:
            smtp.starttls(context=ssl.create_default_context(cafile=relay.ca_bundle))
            smtp.ehlo()
        if relay.username:
            smtp.login(relay.username, relay.password or "")
        smtp.send_message(message)
        return 250


def _text(reply: bytes | str) -> str:
    return (reply.decode(errors="replace") if isinstance(reply, bytes) else reply)[:200]


def _since(started: float) -> float:
    return time.monotonic() - started
