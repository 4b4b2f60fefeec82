"""GovernanceService: governance's use cases, independent of gRPC.

Every change happens with its witness-chain entry in one transaction. Appends
are serialised twice: a process lock (one governance process, many threads)
and ``SELECT ... FOR UPDATE`` on the single head row (replicas on Postgres).

The gate's write path: concurrent calls share one transaction and one fsync
(group commit). Rules and trust come from the :class:`GateCache` when the head
says they are current; every chain entry and decision of the group is
inserted at once, the agents and the head updated, and the group commits. A
retried ``request_id`` is caught by the unique ``(fleet, agent, request_id,
position)`` constraint: the group then reruns with ``replays=True``, which
looks the recorded decisions up first and returns them. A request sent
without neighbours, from an agent a contradiction rule applies to, is judged
to the end first and then dropped (``needs_neighbours``), recording nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy.exc import IntegrityError as SqlIntegrityError
from sqlalchemy.orm import Session

from services.common.access import Restrictions
from services.common.db import Database
from services.common.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    IntegrityError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from services.common.group_commit import GroupCommit
from services.common.metrics import Tally
from services.common.settings import MAX_AUTH_LEEWAY_SECONDS
from services.common.storage_errors import outcome_known
from services.common.tokens import MAX_TTL_SECONDS
from services.governance.domain.decisions import (
    IMPORTED_DECISION,
    Decision,
    check_same_request,
    decision_id,
)
from services.governance.domain.erasures import IMPORTED_ERASURE, RECORDED_ERASURE, Erasure
from services.governance.domain.replay import (
    ChainReplay,
    erasure_differences,
    revocation_differences,
)
from services.governance.domain.revocation import (
    AccessSnapshot,
    AgentRevocation,
    TokenRevocation,
)
from services.governance.domain.rules import (
    MAX_RULES_PER_FLEET,
    SUSPENDED_RULE_ID,
    Candidate,
    PatternVerdicts,
    Rule,
    RuleKind,
    Violation,
    denied_by_patterns,
    judge,
    needs_neighbours,
)
from services.governance.domain.tiers import AgentTrust, TrustAccumulator, TrustTier
from services.governance.domain.witness import (
    GENESIS,
    ChainEntry,
    Checkpoint,
    HeadState,
    NewEntries,
    extends,
    verify_links,
)
from services.governance.gate_cache import AgentKey, GateCache
from services.governance.repository import (
    AccessRepository,
    ErasureRepository,
    GovernanceRepository,
    RequestKey,
)

log = logging.getLogger("engram.governance")
DEFAULT_ERASURE_BYTES_PER_DAY = 64 * 1024 * 1024
"""A fleet's erasures chained a day (about 300,000 items): the chain keeps them for good."""

Clock = Callable[[], int]
MAX_LIVE_REVOKED_TOKENS_PER_FLEET = 1_000
"""Revoked tokens of one fleet not yet expired; one more is FAILED_PRECONDITION
RESTRICTION_LIMIT (revoke the agent's tokens instead). Every fleet's restrictions go to every
service in one ListAccessRestrictions reply: without a bound, one fleet's governor revoking
made-up ids grew it past the 64 MiB message limit, and no service took any fleet's new
revocation or suspension again (found in review, 2026-11-30)."""
MAX_REVOKED_AGENTS_PER_FLEET = 5_000
"""Agents of one fleet whose tokens were revoked within a token's longest life (the rest can
match no token a verifier takes: :func:`_live_agent_revocations_since`), as above."""
MAX_SUSPENDED_PER_FLEET = 5_000
"""Agents of one fleet an operator may hold suspended, as above."""

MAX_GATE_GROUP = 128


@dataclass(frozen=True)
class GateRequest:
    fleet_id: str
    agent_id: str
    request_id: str
    candidates: tuple[Candidate, ...]
    neighbours_omitted: bool = False
    patterns: tuple[PatternVerdicts, ...] = field(default=(), compare=False)
    """Per candidate, the fleet's deny patterns searched before the gate's lock is taken
    (:meth:`GovernanceService._with_patterns`); empty: searched under it."""

    @property
    def key(self) -> RequestKey:
        return self.fleet_id, self.agent_id, self.request_id


@dataclass(frozen=True)
class GateOutcome:
    decisions: list[Decision]
    replayed: bool = False
    """The decisions were recorded by an earlier call."""
    needs_neighbours: bool = False
    """Nothing decided: a contradiction rule applies and the request carried no neighbours."""


@dataclass(frozen=True)
class ChainReport:
    checkpoint: Checkpoint
    """Where the stored chain leads."""
    problems: list[str]
    extends_since: bool
    """The chain extends the checkpoint it was asked about."""

    @property
    def ok(self) -> bool:
        return not self.problems


class GovernanceService:
    def __init__(self, database: Database, clock: Clock, *,
                 erasure_bytes_per_day: int = DEFAULT_ERASURE_BYTES_PER_DAY) -> None:
        self._db = database
        self._repo = GovernanceRepository(database.dialect)
        self._access = AccessRepository()
        self._erasures = ErasureRepository()
        self.erasure_bytes_per_day = erasure_bytes_per_day
        self._clock = clock
        self._append_lock = threading.Lock()
        self._accumulator = TrustAccumulator()
        self._cache = GateCache()
        self.decisions = Tally()
        """Gate decisions recorded, by outcome (allowed, denied) and, if denied, rule kind."""
        self.integrity_failures = Tally()
        """Problems found by chain verifications (at start, in the background, on demand)."""
        self._gate: GroupCommit[GateRequest, GateOutcome] = GroupCommit(
            self._decide_group, max_group=MAX_GATE_GROUP, alone_after=outcome_known)
        self._chain_intact = True
        self._full_verification: threading.Thread | None = None
        self._stopping = threading.Event()  # ends a verification at shutdown

    def now_ms(self) -> int:
        return self._clock()

    # -- the chain checked at start -------------------------------------------------------

    def verify_at_start(self) -> tuple[Checkpoint, list[str]]:
        """Verify the links appended since the last fully verified checkpoint (and that the
        chain still extends it); while that fails, every change is refused. The full check
        (every link, the replay against the state tables) is
        :meth:`start_full_verification`'s, in the background."""
        with self._db.snapshot() as session:
            verified = self._repo.verified_checkpoint(session) or Checkpoint(GENESIS, 0)
            problems: list[str] = []
            if verified.length and not extends(
                    verified, self._repo.link_at(session, verified.length - 1)):
                problems.append(f"the chain does not extend its last verified checkpoint at "
                                f"length {verified.length}: history was rewritten")
            reached, broken = verify_links(self._repo.entries(session, verified.length),
                                           verified)
            problems.extend(broken)
            head = self._repo.head(session)
            if (head.checkpoint if head is not None else Checkpoint(GENESIS, 0)) != reached:
                problems.append("the stored chain head does not match the last chain entry")
        self._chain_intact = not problems
        return reached, problems

    def start_full_verification(self, on_broken: Callable[[list[str]], None]) -> None:
        """Run :meth:`verify` on a thread: on success the verified checkpoint moves to where
        it reached; on failure the service refuses changes and ``on_broken`` hears why."""
        def run() -> None:
            began = time.monotonic()
            log.info("full witness chain verification started")
            try:
                reached, problems = self.verify()
            except _VerificationStopped:
                log.info("full witness chain verification stopped by shutdown")
                return
            except Exception:  # reported, and changes refused: an unverifiable chain is broken
                log.exception("full witness chain verification failed to run")
                reached, problems = Checkpoint(GENESIS, 0), ["the verification failed to run"]
            seconds = round(time.monotonic() - began, 2)
            if problems:
                self._chain_intact = False
                on_broken(problems)  # before the log line says so: whoever reads it sees it done
                log.error(
                    "WITNESS CHAIN BROKEN: governance state does not match its chain; refusing "
                    "to record anything and reporting NOT_SERVING until it is restored",
                    extra={"problems": problems[:20], "problem_count": len(problems),
                           "chain_length": reached.length, "seconds": seconds})
            else:
                log.info("full witness chain verification passed",
                         extra={"chain_length": reached.length, "head": reached.head,
                                "seconds": seconds})

        self._full_verification = threading.Thread(target=run, name="chain-verify", daemon=True)
        self._full_verification.start()

    def wait_full_verification(self, timeout: float | None = None) -> None:
        if self._full_verification is not None:
            self._full_verification.join(timeout)

    def stop_full_verification(self) -> None:
        """At shutdown: end a running verification (it reports nothing) before the store
        closes."""
        self._stopping.set()
        self.wait_full_verification()

    def _until_stopped(self, entries: Iterator[ChainEntry]) -> Iterator[ChainEntry]:
        for entry in entries:
            if self._stopping.is_set():
                raise _VerificationStopped
            yield entry

    @property
    def chain_intact(self) -> bool:
        return self._chain_intact

    def require_writable(self) -> None:
        if not self._chain_intact:
            raise IntegrityError(
                "the witness chain failed verification at start; governance refuses to record "
                "anything until it is restored (run `engram gov chain verify` for details)",
                reason="WITNESS_CHAIN_BROKEN")

    # -- the gate -------------------------------------------------------------------------

    def decide(self, fleet_id: str, agent_id: str, request_id: str,
               candidates: Sequence[Candidate], *,
               neighbours_omitted: bool = False,
               active: Callable[[], bool] = lambda: True) -> GateOutcome:
        """Judge and record; a known ``request_id`` returns the recorded decisions (replayed).

        With ``neighbours_omitted``, an agent a contradiction rule applies to gets
        ``needs_neighbours`` and nothing is recorded. ``active``: whether the caller is still
        there; once it is not, the deny-pattern search stops (ABORTED, nothing recorded).
        """
        return self._gate.submit(self._with_patterns(GateRequest(
            fleet_id, agent_id, request_id, tuple(candidates), neighbours_omitted), active))

    def decide_all(self, requests: Sequence[GateRequest],
                   active: Callable[[], bool] = lambda: True,
                   ) -> list[GateOutcome | BaseException]:
        """Several gate requests at once (a coalesced call): each judged and recorded as if
        sent alone, in one group commit when they fit; an outcome or the error it alone got.
        A caller gone during the deny-pattern search: ABORTED, none recorded."""
        return self._gate.submit_all([self._with_patterns(r, active) for r in requests])

    def _with_patterns(self, request: GateRequest, active: Callable[[], bool]) -> GateRequest:
        """``request`` with its candidates searched by the fleet's deny patterns, here in the
        caller's thread and outside the append lock: the lock is one for every fleet, and a
        fleet's patterns over a batch of long writes may take a while (RE2 lets go of the GIL
        meanwhile). The rules are those last seen; a rule made since is searched under the
        lock, and one deleted since is simply not asked.

        Before each search the caller must still be there: 100 patterns over 1,000 candidates
        of 32 KB are 100,000 searches, seconds to minutes of a core, which went on after the
        shard's deadline had passed (left open by the review of 2026-11-30)."""
        rules = self._cache.rules(request.fleet_id)
        if rules is None:
            with self._db.session() as session:
                rules = self._repo.fleet_rules(session, request.fleet_id)
        if not any(rule.kind is RuleKind.DENY_PATTERN for rule in rules):
            return request

        def caller_there() -> None:
            if not active():
                raise Aborted("the caller went away (deadline or cancel): the search of its "
                              "writes by the fleet's deny patterns stopped; nothing was "
                              "recorded", reason="GATE_ABANDONED")

        return replace(request, patterns=tuple(denied_by_patterns(candidate, rules, caller_there)
                                               for candidate in request.candidates))

    def _decide_group(self, requests: Sequence[GateRequest]) -> list[GateOutcome]:
        try:
            return self._record_group(requests, replays=False)
        except SqlIntegrityError:
            # A request_id seen before (or recorded by another replica meanwhile): look it up.
            return self._record_group(requests, replays=True)

    def _record_group(self, requests: Sequence[GateRequest], *,
                      replays: bool) -> list[GateOutcome]:
        with self._append_lock:
            try:
                with self._db.session() as session:
                    self._repo.begin_append(session)
                    head = self._repo.lock_head(session)
                    self._cache.align(head)
                    recorded = (self._repo.recorded_decisions(session, {r.key for r in requests})
                                if replays else {})
                    group = _GateGroup(self._repo, session, self._cache, head, self._clock(),
                                       self._accumulator, recorded)
                    outcomes = [group.decide(request) for request in requests]
                    after = group.flush()
            except BaseException:
                self._cache.forget()
                raise
            self._cache.committed(after, group.agents_after)
            for outcome, rule in group.tallied:  # counted once committed
                self.decisions.add(outcome, rule)
            return outcomes

    # -- trust ----------------------------------------------------------------------------

    def trust_of(self, fleet_id: str, agent_ids: Collection[str]) -> dict[str, AgentTrust]:
        """Each agent's trust, the starting trust for an agent never seen."""
        wanted = sorted(set(agent_ids))
        with self._db.session() as session:
            found = self._repo.trusts(session, fleet_id, wanted)
        return {a: found.get(a) or AgentTrust(fleet_id, a) for a in wanted}

    @contextmanager
    def _state_change(self) -> Iterator[Session]:
        """An operator change under the append lock; the gate cache rereads afterwards."""
        with self._append_lock:
            try:
                with self._db.session() as session:
                    self._repo.begin_append(session)
                    yield session
            finally:
                self._cache.forget()

    def _append(self, session: Session, head: HeadState, kind: str, payload: dict[str, Any],
                created_ms: int, *, rules_changed: bool = False) -> int:
        """One chain entry after the locked ``head``; the caller writes the state it records."""
        chain = NewEntries(head.checkpoint)
        seq = chain.add(kind, payload)
        self._repo.append_entries(session, chain.entries, created_ms)
        rules_version = head.rules_version + 1 if rules_changed else head.rules_version
        self._repo.write_head(session, HeadState(chain.reached.length, chain.reached.head,
                                                 rules_version))
        return seq

    def set_tier(self, fleet_id: str, agent_id: str, tier: TrustTier, actor: str,
                 reason: str) -> AgentTrust:
        with self._state_change() as session:
            head = self._repo.lock_head(session)
            now_ms = self._clock()
            stored = self._repo.trust(session, fleet_id, agent_id)
            before = stored or AgentTrust(fleet_id, agent_id)
            if tier is TrustTier.SUSPENDED and before.tier is not TrustTier.SUSPENDED:
                _within_restrictions(
                    self._access.suspended_count(session, fleet_id), MAX_SUSPENDED_PER_FLEET,
                    fleet_id, "suspended agents", "lift a suspension first")
            after = self._accumulator.operator_sets(before, tier, now_ms)
            seq = self._append(session, head, "tier.set", {
                "agent": after.state(), "actor": actor, "reason": reason,
                "from_tier": before.tier.value}, now_ms)
            if stored is None:
                self._repo.insert_agents(session, [(after, seq)])
            else:
                self._repo.update_agents(session, [(after, seq)])
            self._access.bump_version(session)  # suspension is part of the restrictions
            return after

    def import_decisions(self, decisions: Sequence[Decision], actor: str) -> tuple[int, int]:
        """Decisions another governance recorded, each appended as an imported entry and kept
        as it was (the caller checked each id derives from its content); ``(created, already
        present)``. All or nothing: a conflict stores none of them."""
        with self._state_change() as session:
            head = self._repo.lock_head(session)
            stored: dict[str, Decision] = {}
            for fleet_id in {d.fleet_id for d in decisions}:
                stored |= self._repo.decisions_by_id(
                    session, fleet_id, [d.decision_id for d in decisions if d.fleet_id == fleet_id])
            chain = NewEntries(head.checkpoint)
            new: list[Decision] = []
            for decision in decisions:
                prior = stored.get(decision.decision_id)
                if prior is not None:
                    if prior.state() != decision.state():
                        raise AlreadyExists(
                            f"decision {decision.decision_id} is already recorded here with "
                            "other content; nothing of this call was imported",
                            reason="DECISION_CONFLICT",
                            metadata={"decision_id": decision.decision_id})
                    continue
                seq = chain.add(IMPORTED_DECISION, {"decision": decision.state(),
                                                    "actor": actor})
                new.append(replace(decision, chain_seq=seq))
                stored[decision.decision_id] = decision
            if new:
                self._repo.append_entries(session, chain.entries, self._clock())
                self._repo.insert_decisions(session, new)
                self._repo.write_head(session, HeadState(chain.reached.length,
                                                         chain.reached.head, head.rules_version))
            return len(new), len(decisions) - len(new)

    # -- revocation and the access restrictions every service enforces --------------------

    def revoke_token(self, revocation: TokenRevocation) -> tuple[TokenRevocation, bool]:
        """Record it; ``(stored, created)``: the earlier one when the jti was revoked already
        until at least as late, else this one (chained again: a revocation lasts as long as
        the latest expiry it was given, so one recorded with a wrong, earlier expiry does not
        keep a later, right one from taking effect)."""
        with self._state_change() as session:
            existing = self._access.revoked_token(session, revocation.fleet_id, revocation.jti)
            if existing is not None and existing.expires_ms >= revocation.expires_ms:
                return existing, False
            head = self._repo.lock_head(session)
            listed_since = _live_token_revocations_since(self._clock())
            if existing is None or existing.expires_ms < listed_since:  # a new entry in the feed
                _within_restrictions(
                    self._access.live_revoked_token_count(session, revocation.fleet_id,
                                                          listed_since),
                    MAX_LIVE_REVOKED_TOKENS_PER_FLEET, revocation.fleet_id,
                    "revoked tokens not yet expired",
                    "revoke the agent's tokens (RevokeAgentTokens) instead, or wait for some "
                    "to expire")
            seq = self._append(session, head, "token.revoked",
                               {"revocation": revocation.state()}, revocation.revoked_ms)
            if existing is None:
                self._access.insert_revoked_token(session, revocation, seq)
            else:
                self._access.replace_revoked_token(session, revocation, seq)
            self._access.bump_version(session)
            return revocation, True

    # -- erasures (engram forget) ---------------------------------------------------------

    def record_erasure(self, erasure: Erasure) -> tuple[Erasure, bool]:
        """Chain it; ``(stored, created)``, the earlier one when its id was recorded already
        (a retry), which must be of the same fleet."""
        with self._state_change() as session:
            existing = self._erasures.get(session, erasure.erasure_id)
            if existing is not None:
                return existing, False
            head = self._repo.lock_head(session)  # erasures are counted under the chain's lock
            self._within_erasure_quota(session, erasure)
            seq = self._append(session, head, RECORDED_ERASURE,
                               {"erasure": erasure.state()}, erasure.created_ms)
            self._erasures.insert(session, erasure, seq)
            return replace(erasure, chain_seq=seq), True

    def _within_erasure_quota(self, session: Session, erasure: Erasure) -> None:
        """Governance cannot check that an erasure's items exist, and the chain keeps every
        erasure for good: a fleet records at most ``erasure_bytes_per_day`` of them a day."""
        since = erasure.created_ms - 86_400_000
        used = self._erasures.bytes_since(session, erasure.fleet_id, since)
        size = len(json.dumps(erasure.state(), sort_keys=True))
        if used + size > self.erasure_bytes_per_day:
            raise ResourceExhausted(
                f"fleet {erasure.fleet_id} recorded {used} bytes of erasures in the last 24 h; "
                f"this one ({size} bytes) would pass ENGRAM_GOVERNANCE_ERASURE_BYTES_PER_DAY "
                f"({self.erasure_bytes_per_day}); retry later or raise the setting",
                reason="ERASURE_QUOTA")

    def import_erasures(self, erasures: Sequence[Erasure], actor: str) -> tuple[int, int]:
        """Erasures another governance recorded, each chained as an imported entry and kept as
        it was; ``(created, already present)``. All or nothing: a conflict stores none. Not
        counted against the daily erasure quota (an admin's import of a fleet's history)."""
        with self._state_change() as session:
            head = self._repo.lock_head(session)
            chain = NewEntries(head.checkpoint)
            new: list[Erasure] = []
            seen: dict[str, Erasure] = {}
            for erasure in erasures:
                prior = seen.get(erasure.erasure_id) or self._erasures.get(session,
                                                                           erasure.erasure_id)
                if prior is not None:
                    if prior.fleet_id != erasure.fleet_id or prior.state() != erasure.state():
                        raise AlreadyExists(
                            f"erasure {erasure.erasure_id} is already recorded here with other "
                            "content; nothing of this call was imported",
                            reason="ERASURE_CONFLICT",
                            metadata={"erasure_id": erasure.erasure_id})
                    continue
                seq = chain.add(IMPORTED_ERASURE, {"erasure": erasure.state(), "actor": actor})
                new.append(replace(erasure, chain_seq=seq))
                seen[erasure.erasure_id] = erasure
            if new:
                self._repo.append_entries(session, chain.entries, self._clock())
                for erasure in new:
                    self._erasures.insert(session, erasure, erasure.chain_seq)
                self._repo.write_head(session, HeadState(chain.reached.length,
                                                         chain.reached.head, head.rules_version))
            return len(new), len(erasures) - len(new)

    def list_erasures(self, fleet_id: str, after_seq: int | None, limit: int) -> list[Erasure]:
        with self._db.session() as session:
            return self._erasures.page(session, fleet_id, after_seq, limit)

    def erasure(self, erasure_id: str) -> Erasure | None:
        with self._db.session() as session:
            return self._erasures.get(session, erasure_id)

    def revoke_agent_tokens(self, fleet_id: str, agent_id: str, actor: str,
                            reason: str) -> AgentRevocation:
        """Every token of the agent issued up to now is refused from now on."""
        with self._state_change() as session:
            head = self._repo.lock_head(session)
            since_ms = _live_agent_revocations_since(self._clock())
            if self._access.revoked_agent_since(session, fleet_id, agent_id, since_ms) is None:
                _within_restrictions(
                    self._access.revoked_agent_count(session, fleet_id, since_ms),
                    MAX_REVOKED_AGENTS_PER_FLEET, fleet_id,
                    f"agents with tokens revoked in the last {MAX_TTL_SECONDS // 86400} days",
                    "each stops counting once no token it can refuse is valid any more "
                    f"({MAX_TTL_SECONDS // 86400} days, the longest a token lives)")
            revocation = AgentRevocation(fleet_id, agent_id, self._clock(), actor, reason)
            seq = self._append(session, head, "agent.tokens_revoked",
                               {"revocation": revocation.state()}, revocation.revoked_ms)
            self._access.upsert_revoked_agent(session, revocation, seq)
            self._access.bump_version(session)
            return revocation

    def access_snapshot(self, since_version: int) -> AccessSnapshot | None:
        """Every restriction in force, or None when their version is still ``since_version``."""
        with self._db.session() as session:
            version = self._access.version(session)
            if version == since_version:
                return None
            now_ms = self._clock()
            return AccessSnapshot(
                version,
                self._access.live_revoked_tokens(session, _live_token_revocations_since(now_ms)),
                self._access.revoked_agents(session, _live_agent_revocations_since(now_ms)),
                self._access.suspended_agents(session))

    def access_restrictions(self, since_version: int) -> Restrictions | None:
        """:meth:`access_snapshot` as governance's own servers enforce it."""
        snapshot = self.access_snapshot(since_version)
        if snapshot is None:
            return None
        return Restrictions(
            version=snapshot.version,
            revoked_tokens={(t.fleet_id, t.jti): t.expires_ms // 1000 for t in snapshot.tokens},
            revoked_agents={(a.fleet_id, a.agent_id): a.issued_before_s for a in snapshot.agents},
            suspended=frozenset(snapshot.suspended))

    # -- rules ----------------------------------------------------------------------------

    @staticmethod
    def allocate_rule_id(fleet_id: str, request_id: str) -> str:
        """From ``request_id`` when given (a retried CreateRule gets the same id), else random."""
        if request_id:
            seed = f"{fleet_id}\x00{request_id}".encode()
            return "r-" + hashlib.sha256(seed).hexdigest()[:12]
        return "r-" + secrets.token_hex(6)

    def create_rule(self, rule: Rule) -> tuple[Rule, bool]:
        """Record ``rule``; ``(stored, created)``, the stored one when its id exists already."""
        with self._state_change() as session:
            existing = self._repo.rule(session, rule.rule_id)
            if existing is not None:
                if existing.fleet_id != rule.fleet_id:
                    raise InvalidArgument("request_id already used in another fleet",
                                          reason="REQUEST_ID_REUSED")
                if _definition(existing) != _definition(rule):
                    # A caller reading OK would believe its rule in force (found by review on
                    # 2026-11-30); the other services refuse a reused request_id alike.
                    raise InvalidArgument(
                        f"request_id was used for another rule ({existing.rule_id}, "
                        f"{existing.kind.value}); use a new request_id for a new rule",
                        reason="REQUEST_ID_REUSED", metadata={"rule_id": existing.rule_id})
                return existing, False
            held = len(self._repo.fleet_rules(session, rule.fleet_id))
            if held >= MAX_RULES_PER_FLEET:
                raise FailedPrecondition(
                    f"fleet {rule.fleet_id!r} holds {held} rules, the most one fleet may hold "
                    "(every write is judged against them all); delete one first "
                    "(`engram gov rules list`, `engram gov rules delete`)", reason="RULE_LIMIT",
                    metadata={"limit": str(MAX_RULES_PER_FLEET)})
            head = self._repo.lock_head(session)
            seq = self._append(session, head, "rule.created", {"rule": rule.state()},
                               rule.created_ms, rules_changed=True)
            self._repo.insert_rule(session, rule, seq)
            return rule, True

    def delete_rule(self, fleet_id: str, rule_id: str, actor: str) -> None:
        with self._state_change() as session:
            existing = self._repo.rule(session, rule_id)
            if existing is None or existing.fleet_id != fleet_id:
                raise NotFound(f"no rule {rule_id!r} in fleet {fleet_id!r}; "
                               "see `engram gov rules list`", reason="RULE_NOT_FOUND")
            head = self._repo.lock_head(session)
            self._append(session, head, "rule.deleted",
                         {"rule_id": rule_id, "fleet_id": fleet_id, "actor": actor},
                         self._clock(), rules_changed=True)
            self._repo.delete_rule(session, rule_id)

    def list_rules(self, fleet_id: str, after: str | None, limit: int) -> list[Rule]:
        with self._db.session() as session:
            return self._repo.rules_page(session, fleet_id, after, limit)

    def list_decisions(self, fleet_id: str, agent_id: str | None, before_seq: int | None,
                       limit: int) -> list[Decision]:
        with self._db.session() as session:
            return self._repo.decisions_page(session, fleet_id, agent_id, before_seq, limit)

    def decisions_by_id(self, fleet_id: str, decision_ids: Sequence[str]) -> list[Decision]:
        """The fleet's decisions among ``decision_ids``, as asked; unknown ones left out."""
        with self._db.session() as session:
            found = self._repo.decisions_by_id(session, fleet_id, set(decision_ids))
        return [found[i] for i in dict.fromkeys(decision_ids) if i in found]

    # -- verification ---------------------------------------------------------------------

    def checkpoint(self) -> Checkpoint:
        with self._db.session() as session:
            head = self._repo.head(session)
        return head.checkpoint if head is not None else Checkpoint(GENESIS, 0)

    def verify(self) -> tuple[Checkpoint, list[str]]:
        """Re-walk every link, then check each state row against what the chain says; when
        all holds, what it reached becomes the verified checkpoint a start checks from. All of
        it reads one snapshot: changes committed meanwhile are not half seen."""
        with self._db.snapshot() as session:
            replay = ChainReplay()
            reached, problems = verify_links(replay.feed(
                self._until_stopped(self._repo.entries(session))))
            head = self._repo.head(session)
            if head is None or head.checkpoint != reached:
                problems.append("the stored chain head does not match the last chain entry")
            problems.extend(replay.differences(self._repo.stored_agents(session),
                                               self._repo.stored_rules(session),
                                               self._repo.stored_decisions(session)))
            problems.extend(revocation_differences(
                replay, self._access.stored_revocations(session)))
            problems.extend(erasure_differences(replay, self._erasures.stored(session)))
        self.integrity_failures.add("CHAIN_PROBLEM", amount=len(problems))
        if not problems:
            try:
                with self._db.session() as session:
                    self._repo.save_verified_checkpoint(session, reached, self.now_ms())
            except SqlIntegrityError:  # another replica saved its own at the same moment
                log.info("verified checkpoint saved by another replica meanwhile")
        return reached, problems

    def verify_chain(self, since: Checkpoint | None) -> ChainReport:
        """:meth:`verify`, and whether the chain still extends ``since`` (no history rewritten)."""
        reached, problems = self.verify()
        extends_since = False
        if since is not None:
            if since.length < 0 or since.length > reached.length:
                problems = [*problems, f"checkpoint length {since.length} is beyond the chain "
                                       f"({reached.length} entries)"]
            else:
                at = self._link_at(since.length - 1) if since.length else None
                extends_since = extends(since, at)
                if not extends_since:
                    problems = [*problems, f"the chain does not extend the checkpoint at "
                                           f"length {since.length}: history was rewritten"]
        return ChainReport(reached, problems, extends_since)

    def _link_at(self, seq: int) -> str | None:
        with self._db.session() as session:
            return self._repo.link_at(session, seq)


class _VerificationStopped(Exception):
    """The service is stopping: a verification in progress ends without a verdict."""


class _GateGroup:
    """One group's judging and recording inside an open transaction (the append lock held)."""

    def __init__(self, repo: GovernanceRepository, session: Session, cache: GateCache,
                 head: HeadState, now_ms: int, accumulator: TrustAccumulator,
                 recorded: dict[RequestKey, list[Decision]]) -> None:
        self._repo = repo
        self._session = session
        self._cache = cache
        self._head = head
        self._chain = NewEntries(head.checkpoint)
        self._now_ms = now_ms
        self._accumulator = accumulator
        self._recorded = recorded
        self._decisions: list[Decision] = []
        self._trust: dict[AgentKey, AgentTrust] = {}
        self._has_row: dict[AgentKey, bool] = {}
        self._agent_seq: dict[AgentKey, int] = {}
        self._accepted: dict[AgentKey, int] = {}
        self._window_counts: dict[tuple[AgentKey, int], int] = {}
        self.tallied: list[tuple[str, str]] = []  # (outcome, rule kind) per new decision

    @property
    def agents_after(self) -> dict[AgentKey, AgentTrust]:
        return self._trust

    def decide(self, request: GateRequest) -> GateOutcome:
        recorded = self._recorded.get(request.key)
        if recorded:
            check_same_request(recorded, request.candidates, request.request_id)
            return GateOutcome(recorded, replayed=True)
        key = (request.fleet_id, request.agent_id)
        trust = self._trust_of(key)
        rules = self._rules_of(request.fleet_id)
        accepted = self._accepted.get(key, 0)

        def writes_within(window_s: int) -> int:
            if (key, window_s) not in self._window_counts:
                self._window_counts[(key, window_s)] = self._repo.accepted_since(
                    self._session, *key, self._now_ms - window_s * 1000)
            return self._window_counts[(key, window_s)] + accepted

        # Judge every candidate before recording any: the tier can move mid-request.
        verdicts: list[tuple[list[Violation], AgentTrust]] = []
        for i, candidate in enumerate(request.candidates):
            if request.neighbours_omitted and needs_neighbours(trust, rules):
                return GateOutcome([], needs_neighbours=True)
            found = request.patterns[i] if request.patterns else None
            violations = judge(candidate, trust, rules, writes_within, found)
            if not violations:
                accepted += 1
            trust = self._accumulator.record_outcome(trust, not violations, self._now_ms)
            verdicts.append((violations, trust))
        self._accepted[key] = accepted
        decisions = []
        for position, (candidate, (violations, after)) in enumerate(
                zip(request.candidates, verdicts, strict=True)):
            allowed = not violations
            decision = Decision(
                decision_id=decision_id(*request.key, position),
                fleet_id=request.fleet_id, agent_id=request.agent_id,
                request_id=request.request_id, position=position,
                record_id=candidate.record_id, content_hash=candidate.content_hash,
                allowed=allowed, rule_ids=tuple(v.rule_id for v in violations),
                reason="; ".join(f"{v.rule_id}: {v.message}" for v in violations),
                created_ms=self._now_ms,
            )
            seq = self._chain.add("gate.decision",
                                  {"decision": decision.state(), "agent": after.state()})
            decision = replace(decision, chain_seq=seq)
            self._decisions.append(decision)
            decisions.append(decision)
            self._agent_seq[key] = seq
        self._trust[key] = trust
        self._recorded[request.key] = decisions
        kinds = {rule.rule_id: rule.kind.value for rule in rules} | {SUSPENDED_RULE_ID: "suspended"}
        for decision in decisions:
            if decision.allowed:
                self.tallied.append(("allowed", ""))
            for rule_id in decision.rule_ids:
                self.tallied.append(("denied", kinds.get(rule_id, "other")))
        return GateOutcome(decisions)

    def flush(self) -> HeadState:
        """Write everything judged so far; return the head the chain now has."""
        if not self._chain.entries:
            return self._head
        session = self._session
        self._repo.append_entries(session, self._chain.entries, self._now_ms)
        self._repo.insert_decisions(session, self._decisions)
        written = {key: (trust, self._agent_seq[key]) for key, trust in self._trust.items()}
        self._repo.update_agents(session, [w for k, w in written.items() if self._has_row[k]])
        self._repo.insert_agents(session, [w for k, w in written.items() if not self._has_row[k]])
        after = HeadState(self._chain.reached.length, self._chain.reached.head,
                          self._head.rules_version)
        self._repo.write_head(session, after)
        return after

    def _trust_of(self, key: AgentKey) -> AgentTrust:
        current = self._trust.get(key)
        if current is not None:
            return current
        known, cached = self._cache.agent(key)
        if not known:
            cached = self._repo.trust(self._session, *key)
            self._cache.remember_agent(key, cached)
        self._has_row[key] = cached is not None
        return cached or AgentTrust(*key)

    def _rules_of(self, fleet_id: str) -> tuple[Rule, ...]:
        rules = self._cache.rules(fleet_id)
        if rules is None:
            rules = self._repo.fleet_rules(self._session, fleet_id)
            self._cache.remember_rules(fleet_id, rules)
        return rules


def _definition(rule: Rule) -> tuple[object, ...]:
    """What a rule does (not who made it or when): a retried CreateRule must ask for the same."""
    return (rule.kind, dict(rule.params), rule.description, frozenset(rule.tiers))


def _within_restrictions(held: int, limit: int, fleet_id: str, what: str, instead: str) -> None:
    """One more access restriction of a kind the fleet holds ``held`` of, or
    FAILED_PRECONDITION RESTRICTION_LIMIT at ``limit`` (see MAX_LIVE_REVOKED_TOKENS_PER_FLEET)."""
    if held >= limit:
        raise FailedPrecondition(
            f"fleet {fleet_id} holds {held} {what}, the most one fleet may hold (every "
            f"service reads every fleet's restrictions); {instead}",
            reason="RESTRICTION_LIMIT", metadata={"limit": str(limit)})


def _live_token_revocations_since(now_ms: int) -> int:
    """Token revocations expiring before this time refuse no token a verifier still takes: a
    token is accepted up to the services' leeway past its exp, so its revocation is listed as
    long (one dropped at exp let a restarted service accept it again)."""
    return now_ms - MAX_AUTH_LEEWAY_SECONDS * 1000


def _live_agent_revocations_since(now_ms: int) -> int:
    """Agent revocations made before this time refuse no token a verifier still takes: every
    token lives at most MAX_TTL_SECONDS from its ``iat`` (verifiers refuse a longer one), and
    is taken up to MAX_AUTH_LEEWAY_SECONDS past its ``exp``."""
    return now_ms - (MAX_TTL_SECONDS + MAX_AUTH_LEEWAY_SECONDS) * 1000
