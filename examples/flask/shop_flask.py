"""A small order shop on Flask + Flask-SQLAlchemy + durable jobs.

    flask --app shop_flask init-db        # once: the job tables and the shop's table
    flask --app shop_flask run            # the web app (SHOP_DATABASE_URL, JOBS_* as usual)
    flask --app shop_flask jobs worker    # a worker: the job runs in this app's context
    flask --app shop_flask jobs sweeper   # recovery, timers, schedules, retention

Staff authenticate with a token of their own (``SHOP_STAFF_TOKENS="erin:<token>,..."``, sent
as ``Authorization: Bearer <token>``): the token names the user, whom the approve endpoint
and the jobs blueprint record as the approver (never a name the request gives). A browser
never attaches a bearer token by itself, so a cross-site form cannot forge a request.

An order and its check job are written in one transaction (the request's ``db.session``):
both commit, or neither does. A full queue answers 429 with ``Retry-After``.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path
from typing import Any

from flask import Flask, Response, current_app, jsonify, request
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import jobs
from jobs.contrib.flask import Jobs, request_json

APPROVAL_OVER_CENTS = 100_000


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)
jobs_ext = Jobs()


class Order(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "shop_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str]
    total_cents: Mapped[int]
    job_id: Mapped[str] = mapped_column(default="")
    checked: Mapped[bool] = mapped_column(default=False)


def load(order_id: int) -> dict[str, Any]:
    order = db.session.get(Order, order_id)
    if order is None:
        raise LookupError(f"no order {order_id}")
    return {"order_id": order.id, "total_cents": order.total_cents}


def mark_checked(order_id: int) -> bool:
    order = db.session.get(Order, order_id)
    if order is None:
        return False
    order.checked = True
    db.session.commit()
    return True


@jobs.job("check_flask_order", max_attempts=3, max_queued=20)
def check_order(ctx: jobs.JobContext, order_id: int) -> dict[str, Any]:
    """Runs in the app's context: ``db.session`` works here as in a view."""
    order = ctx.step("load", load, order_id)
    approved_by = None
    if order["total_cents"] > APPROVAL_OVER_CENTS:
        approved_by = ctx.wait_for_approval("large order")["approved_by"]
    ctx.step("mark_checked", mark_checked, order_id)
    return {"order_id": order_id, "approved_by": approved_by}


def staff_tokens(text: str | None) -> dict[str, str]:
    """``SHOP_STAFF_TOKENS`` (``user:token,user:token``) as {user: token}."""
    pairs = (entry.partition(":") for entry in (text or "").split(",") if entry.strip())
    named = {user.strip(): token.strip() for user, _, token in pairs}
    return {user: token for user, token in named.items() if user and token}


def authenticated_staff() -> str | None:
    """The staff user whose token the request carries (``Authorization: Bearer <token>``),
    or ``None``. Every token is compared, in constant time."""
    given = request.headers.get("Authorization", "").encode()
    found = None
    for user, token in (current_app.config.get("SHOP_STAFF") or {}).items():
        if hmac.compare_digest(given, f"Bearer {token}".encode()):
            found = user
    return found


def shop_staff(action: str, kind: str, job: jobs.Job | None) -> str | None:
    """Who may use the jobs blueprint: staff, as the user their token names (403 else)."""
    return authenticated_staff()


def create_app(config: dict[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    data_dir = Path(os.environ.get("JOBS_DATA_DIR") or "jobs-data").absolute()
    data_dir.mkdir(parents=True, exist_ok=True)
    app.config["SQLALCHEMY_DATABASE_URI"] = (
        os.environ.get("SHOP_DATABASE_URL") or f"sqlite:///{data_dir / 'shop.sqlite3'}"
    )
    app.config["JOBS"] = {"DATA_DIR": str(data_dir)}
    app.config["SHOP_STAFF"] = staff_tokens(os.environ.get("SHOP_STAFF_TOKENS"))
    app.config.update(config or {})
    db.init_app(app)
    jobs_ext.init_app(app, db)
    app.register_blueprint(jobs_ext.blueprint(authorize=shop_staff))

    @app.post("/orders")
    def create_order() -> tuple[Response, int]:
        body = request_json(force=True)  # bounded: 413 past JOBS_MAX_INPUT_BYTES, chunked too
        if not isinstance(body, dict):
            return jsonify(error="the body must be a JSON object"), 400
        order = Order(customer=body["customer"], total_cents=body["total_cents"])
        db.session.add(order)
        db.session.flush()  # the order's ID, for the job's inputs
        order.job_id = jobs_ext.submit("check_flask_order", {"order_id": order.id})
        if body.get("fail_after_submit"):
            raise RuntimeError("failed after the submit: the order and its job roll back")
        db.session.commit()
        return jsonify(order_id=order.id, job_id=order.job_id), 201

    @app.get("/orders/<int:order_id>")
    def show_order(order_id: int) -> tuple[Response, int]:
        order = db.session.get(Order, order_id)
        if order is None:
            return jsonify(error="no such order"), 404
        job = jobs.get(order.job_id)
        return jsonify(
            order_id=order.id,
            checked=order.checked,
            job={"id": job.id, "state": job.state.value, "result": job.result},
        ), 200

    @app.post("/orders/<int:order_id>/approve")
    def approve_order(order_id: int) -> tuple[Response, int]:
        user = authenticated_staff()
        if user is None:
            return jsonify(error="staff only: Authorization: Bearer <token>"), 401
        order = db.session.get(Order, order_id)
        if order is None:
            return jsonify(error="no such order"), 404
        try:
            job = jobs_ext.approve(order.job_id, by=user)
        except jobs.IllegalTransition as err:
            return jsonify(error=str(err)), 409
        db.session.commit()
        return jsonify(job={"id": job.id, "state": job.state.value}), 200

    @app.cli.command("init-db")
    def init_db() -> None:
        """Create the job tables and the shop's table (create_app already did): run it once
        before the worker and the web app start together, so they do not race to create them."""
        print("tables ready")

    jobs_ext.create_tables()  # the job tables (jobctl db upgrade does the same)
    with app.app_context():
        db.create_all()  # the shop's own table
    return app


app = create_app()
