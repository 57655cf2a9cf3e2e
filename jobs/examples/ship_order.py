"""An operator's bad day in one job: charge, ship, then email, where the email step fails
until the bug is "fixed" (a flag file ``mailer.fixed`` in the data folder). Each step
appends to ``effects.log`` (as :mod:`jobs.examples.check_order`'s do), so a test counts how
often each step's function really ran: after ``jobctl retry``, the charge and the shipment
must not run again.
"""

from __future__ import annotations

from typing import Any

import jobs
from jobs.application import default_app
from jobs.examples.check_order import _effect


class MailerDown(RuntimeError):
    """The shipped bug: the email step fails until ``mailer.fixed`` exists."""


def _charge(job_id: str, order_id: int) -> dict[str, Any]:
    _effect("charge", job_id)
    return {"order_id": order_id, "charged_cents": 4200}


def _ship(job_id: str, order_id: int) -> str:
    _effect("ship", job_id)
    return f"parcel-{order_id}"


def _email(job_id: str, parcel: str) -> bool:
    _effect("email", job_id)
    if not (default_app().settings.data_dir / "mailer.fixed").exists():
        raise MailerDown(f"mailer: template for {parcel} is broken (ConnectionTimeout)")
    return True


@jobs.job("ship_order", max_attempts=1, version="1")
def ship_order(ctx: jobs.JobContext, order_id: int) -> dict[str, Any]:
    """Charge, ship, email: three steps, the third broken until the fix is deployed."""
    charged = ctx.step("charge", _charge, ctx.job_id, order_id)
    parcel = ctx.step("ship", _ship, ctx.job_id, order_id)
    ctx.step("email", _email, ctx.job_id, parcel)
    return {"order_id": order_id, "charged_cents": charged["charged_cents"], "parcel": parcel}
