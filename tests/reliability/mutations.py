"""Does the reliability suite notice when a guard is removed? (A tool run by hand.)

For each guard in ``MUTATIONS``: copy the repository to a scratch directory, replace one
exact piece of text there (the guard) with a broken version, run the scenarios that
should notice, and report the mutation *killed* (some test failed) or *SURVIVED* (every
test passed: the suite does not protect that guard). A baseline run of the unmutated
copy comes first, so a kill means the mutation, not a broken suite. See MUTATIONS.md for
the last recorded results.

    .venv/bin/python tests/reliability/mutations.py            # everything (~20 min)
    .venv/bin/python tests/reliability/mutations.py --check    # only: are the anchors there?
    .venv/bin/python tests/reliability/mutations.py --only done_fence_one,retry_fence

The scratch copy is first on ``PYTHONPATH`` and is the working directory of pytest, so
pytest and the worker processes it starts (``python -m sqla_jobs.worker``, same
interpreter, environment inherited) import the mutated ``sqla_jobs``, not the installed
one; the script checks that before running anything.

When the code moves, update the table below: every ``original`` must occur exactly once
in its file, and the script refuses to run (naming the mutation) when one does not.
Not part of the test suite: it is slow, and pytest does not collect this file.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REL = "tests/reliability"
# Workflows (#26): in-process scenarios of tests/test_workflows.py and a kill storm.
_FLOWS = "tests/test_workflows.py::"
FLOW_FAN_IN = _FLOWS + (
    "test_a_fan_in_runs_each_step_once_after_its_dependencies_and_sees_their_results"
)
FLOW_CONCURRENT_PARENTS = _FLOWS + (
    "test_two_parents_ending_in_concurrent_transactions_release_their_child_once"
)
FLOW_TRANSITIVE = _FLOWS + (
    "test_a_dead_dependency_cancels_its_dependents_transitively_naming_the_upstream_step"
)
FLOW_DELETED = _FLOWS + ("test_an_operator_cancel_or_delete_of_a_dependency_cancels_its_dependents")
FLOW_STALE = _FLOWS + (
    "test_a_stale_workers_done_mark_releases_nothing_and_the_current_one_releases_once"
)
FLOW_ARCHIVER = _FLOWS + "test_the_archiver_leaves_every_step_of_an_unfinished_workflow"
FLOW_ARCHIVER_PROGRESS = _FLOWS + "test_an_unfinished_workflows_old_steps_do_not_hold_up_other_jobs"
FLOW_ARCHIVE_WHOLE = _FLOWS + (
    "test_the_archiver_moves_a_finished_workflow_bigger_than_a_batch_in_one_batch"
)
FLOW_ARCHIVE_LOCKED = _FLOWS + (
    "test_a_workflow_with_a_step_locked_elsewhere_is_left_whole_for_the_next_batch"
)
FLOW_PRUNE_WHOLE = _FLOWS + "test_prune_deletes_an_archived_workflow_as_a_unit"
# History (#25): a long archive or prune starts each batch where the last one stopped.
_FLOORS = "tests/test_archive_floors.py::"
FLOORS_PRUNE = _FLOORS + "test_each_batch_of_a_long_prune_reads_as_much_as_the_first"
PRUNE_OWN_PARTITION = _FLOORS + (
    "test_a_prune_batch_deletes_each_row_from_its_own_partition_not_from_every_week"
)
FLOORS_ARCHIVE = _FLOORS + (
    "test_each_batch_of_a_long_archive_reads_as_much_as_the_first_in_every_range"
)
FLOORS_NO_JIT = _FLOORS + "test_archive_and_prune_batches_are_never_jit_compiled"
FLOW_RELEASED_ALONE = _FLOWS + ("test_a_fan_outs_children_are_released_without_writing_their_edges")
FLOW_APPENDED = _FLOWS + (
    "test_steps_appended_to_a_running_workflow_wait_for_its_steps_or_run_at_once"
)
FLOW_LEAVES = _FLOWS + "test_a_step_no_step_depends_on_is_a_leaf_until_a_step_is_appended_after_it"
FLOW_LEAF_SELF = _FLOWS + "test_a_step_appended_by_a_leaf_after_itself_is_released_by_its_done_mark"
FLOW_LEAF_MEANWHILE = _FLOWS + (
    "test_a_step_appended_after_a_leaf_that_ended_meanwhile_is_released_at_commit"
)
FLOW_APPEND_WHILE_ARCHIVING = _FLOWS + (
    "test_a_step_appended_while_the_archiver_runs_keeps_its_workflow_whole"
)
FLOW_RETRY_REFUSED = _FLOWS + (
    "test_retrying_a_step_cancelled_by_its_failed_dependency_alone_is_refused_naming_it"
)
FLOW_CALLBACKS = _FLOWS + "test_batch_callbacks_on_success_on_failure_and_on_complete"
FLOW_SWEEP = _FLOWS + "test_the_sweep_releases_a_step_whose_release_was_missed"
FLOW_STATS_WAITING = _FLOWS + "test_stats_count_waiting_steps_apart_from_ready_and_scheduled"
FLOW_RETRY_REOPENS = _FLOWS + (
    "test_retrying_a_dead_step_reopens_the_steps_it_cancelled_and_the_workflow_resumes"
)
FLOW_RETRY_BLOCKED = _FLOWS + (
    "test_a_retried_steps_dependent_that_another_failed_step_cancelled_stays_cancelled"
)
FLOW_DASHBOARD_PERMISSIONS = "tests/test_dashboard_workflows.py::" + (
    "test_read_only_and_unpermitted_viewers_see_no_workflow_action_and_cannot_post_one"
)
_FLOW_CLI = "tests/test_workflow_cli.py::"
FLOW_CLI_ERRORS = _FLOW_CLI + (
    "test_a_failed_steps_error_shows_its_first_line_and_after_a_retry_it_is_earlier"
)
FLOW_CLI_FLAGS = _FLOW_CLI + "test_a_workflow_flag_the_action_does_not_take_is_a_usage_error"
FLOW_CLI_INDEX = _FLOW_CLI + "test_a_workflows_page_reads_the_workflow_index_not_the_table"
_TRIAL = "tests/test_dashboard_trial.py::"
TRIAL_WAITING_CANCEL = _TRIAL + (
    "test_a_waiting_step_can_be_cancelled_from_its_page_and_its_dependents_follow"
)
TRIAL_DEEP_FILTER = _TRIAL + "test_a_json_filter_nested_too_deeply_is_a_400_naming_it"
TRIAL_NO_MATCH = _TRIAL + "test_a_filter_no_job_can_match_is_a_400_naming_it_and_the_rule"
TRIAL_TIMEOUT = _TRIAL + "test_a_jobs_timeout_falls_back_to_its_handlers_on_the_page_and_in_show"
TRIAL_MULTIPART = _TRIAL + "test_a_multipart_form_is_refused_saying_forms_are_sent_urlencoded"
TRIAL_ZONE = _TRIAL + "test_a_schedules_next_and_last_tick_are_shown_in_its_own_zone"
TRIAL_ENDED_WAITS = _TRIAL + (
    "test_a_cancelled_step_waits_on_nothing_and_the_page_carries_what_the_script_updates"
)
BROWSER_FLOW_LIVE = "tests/test_dashboard_browser.py::" + (
    "test_a_workflow_pages_counts_and_waits_on_follow_a_cancel_live"
)
DASHBOARD_STOPS_MID_ROUND = "tests/test_dashboard_cli.py::" + (
    "test_dashboard_command_stops_without_waiting_for_the_live_views_query_in_flight"
)
TRIAL_ACTION_TEXT = _TRIAL + (
    "test_refusals_name_the_states_each_action_applies_to_in_ops_cli_and_dashboard"
)
FLOW_DASHBOARD_BUTTONS = "tests/test_dashboard_workflows.py::" + (
    "test_each_workflow_action_shows_only_to_a_viewer_with_its_permission"
)
FLOW_STALE_PROCESS = (
    f"{REL}/test_workflow_crashes.py::test_a_stale_workers_step_is_fenced_out_and_releases_nothing"
)
FLOW_STORM = (
    f"{REL}/test_workflow_crashes.py::"
    "test_workers_killed_during_a_fan_in_run_every_step_and_the_fan_in_once"
)
# Dashboard and queue control (#22): a change that changes nothing is no change.
CONTROL_NO_CHANGE = "tests/test_queue_control_api.py::" + (
    "test_each_control_change_says_whether_it_changed_anything_and_writes_nothing_if_not"
)
DASHBOARD_NO_CHANGE = "tests/test_dashboard.py::" + (
    "test_an_action_that_changes_nothing_says_so_and_is_not_recorded"
)
DASHBOARD_UNSERVED = "tests/test_dashboard.py::" + (
    "test_pausing_or_limiting_a_name_no_live_worker_serves_notes_a_possible_typo"
)

# The scenarios, by what they prove (pytest node ids relative to the repository root).
FENCED_TAKEOVER = (
    f"{REL}/test_fencing.py::"
    "test_stale_worker_resumed_during_the_replacement_runs_changes_none_of_them"
)
FENCED_HEARTBEAT = (
    f"{REL}/test_fencing.py::"
    "test_stale_worker_heartbeat_does_not_keep_a_dead_replacements_lease_alive"
)
STALE_AFTER_DONE = (
    f"{REL}/test_crashes.py::test_stale_worker_resumed_after_takeover_is_fenced_and_rolls_back"
)
KILL_POINTS = (
    f"{REL}/test_crashes.py::test_kill_at_every_point_of_a_jobs_life_keeps_effect_and_done_together"
)
NEW_RUN_HEARTBEAT = (
    f"{REL}/test_fencing.py::"
    "test_a_workers_stale_run_ending_does_not_stop_the_heartbeat_of_its_new_run_of_the_job"
)
NO_OVERLAP = f"{REL}/test_crashes.py::test_no_two_runs_of_a_job_overlap_while_heartbeats_are_alive"
_FAILOVER = f"{REL}/test_failover.py::"
SYNC_FAILOVER = (
    f"{_FAILOVER}test_failover_with_synchronous_replication_runs_every_committed_job_exactly_once"
)
IDLE_FAILOVER = (
    f"{_FAILOVER}test_an_idle_workers_listener_and_idle_flag_are_back_on_the_new_primary"
)
READ_ONLY_NODE = (
    f"{_FAILOVER}test_a_primary_turned_read_only_under_open_sockets_is_left_for_the_new_primary"
)
DEAD_LISTEN_SOCKET = (
    f"{_FAILOVER}test_a_dead_listen_socket_is_noticed_by_the_probe_and_the_worker_claims_at_once"
)
RESTART_PREPARED = (
    f"{REL}/test_db_faults.py::"
    "test_after_a_postgresql_restart_the_workers_statements_are_prepared_again_on_new_backends"
)
ENGINE_KEEPALIVES = (
    "tests/test_connlost.py::test_an_engine_passed_in_gets_the_tcp_defaults_it_does_not_set_itself"
)
ENGINE_KEEPALIVES_WARNING = (
    "tests/test_connlost.py::"
    "test_an_engine_whose_creator_bypasses_the_defaults_is_warned_about_once"
)
PROBE_TIMEOUT_SETTING = (
    "tests/test_services.py::"
    "test_the_listener_gives_up_an_unanswered_probe_after_its_configured_timeout_and_reconnects"
)
FROZEN_HANDLER_LINK = (
    f"{REL}/test_db_faults.py::"
    "test_a_handler_connection_whose_peer_stops_acknowledging_is_given_up_by_tcp_user_timeout"
)
SHUTDOWN = f"{REL}/test_shutdown.py"
GIVE_BACK = (
    f"{REL}/test_shutdown.py::"
    "test_sigterm_gives_buffered_jobs_back_at_once_with_their_attempt_unspent"
)
MISBEHAVING = (
    f"{REL}/test_handlers.py::"
    "test_misbehaving_handlers_are_recorded_failures_with_no_partial_writes"
)
POISON = (
    f"{REL}/test_handlers.py::"
    "test_poison_job_that_kills_its_worker_is_dead_after_exactly_max_attempts"
)
BUSY_LISTENER_FAULT = (
    f"{REL}/test_db_faults.py::"
    "test_a_terminated_listen_connection_comes_back_and_notifications_resume"
)
BUSY_BACKENDS_FAULT = f"{REL}/test_db_faults.py::test_workers_survive_termination_of_every_backend"
IDLE_LISTENER_FAULT = (
    f"{REL}/test_db_faults.py::"
    "test_an_idle_workers_killed_listen_connection_comes_back_and_notifications_wake_it"
)
IDLE_BACKENDS_FAULT = (
    f"{REL}/test_db_faults.py::"
    "test_an_idle_worker_whose_backends_were_all_killed_is_woken_by_notifications"
)
IDLE_RESTART = (
    f"{REL}/test_db_faults.py::"
    "test_an_idle_worker_is_woken_by_notifications_after_a_postgresql_restart"
)
LISTENER_AWAY = (
    f"{REL}/test_db_faults.py::"
    "test_jobs_enqueued_while_the_listener_was_away_are_picked_up_when_it_is_back"
)
COMMIT_IN_FLIGHT = (
    f"{REL}/test_notify_window.py::"
    "test_a_commit_in_flight_while_the_worker_goes_idle_is_waited_out_and_claimed"
)
ENQUEUE_ROLLBACK = "tests/test_enqueue.py::test_rollback_leaves_no_job"
ENQUEUE_NO_COMMIT = "tests/test_enqueue.py::test_enqueue_never_commits"
TAKEN_KEY_ANY_STYLE = (
    "tests/test_orm_enqueue.py::"
    "test_a_taken_key_inserts_nothing_and_the_callers_transaction_commits_its_other_writes"
)
TIMESTAMPS = "tests/test_timestamps.py"
HANDLER_MAX_ATTEMPTS = (
    "tests/test_handler_defaults.py::"
    "test_a_job_enqueued_without_max_attempts_gets_its_handlers_when_a_worker_runs_it"
)
UNSERVED_WARNING = (
    "tests/test_handler_defaults.py::"
    "test_the_worker_warns_once_about_ready_jobs_of_its_kinds_in_a_queue_it_does_not_serve"
)
# The newer features' scenarios (issue #21).
QUEUE_CONTROL = "tests/test_queue_control.py"
OPERATOR_LIMIT = (
    f"{QUEUE_CONTROL}::test_an_operator_lowering_a_declared_limit_at_run_time_binds_every_claim"
)
KIND_LIMIT = f"{QUEUE_CONTROL}::test_a_kind_limit_holds_across_four_workers_and_every_job_runs_once"
HELD_BACK = (
    f"{QUEUE_CONTROL}::test_short_limited_jobs_held_back_beyond_the_limit_never_overlap_past_it"
)
RESERVE_GATE = (
    "tests/test_limit_reserves.py::"
    "test_a_worker_holds_jobs_back_beyond_the_limit_and_starts_one_per_job_that_ends"
)
RATE = f"{QUEUE_CONTROL}::test_a_rate_of_ten_per_second_puts_no_more_than_ten_claims_in_any_second"
PAUSE = (
    f"{QUEUE_CONTROL}::test_pause_lets_running_jobs_finish_starts_nothing_survives_a_restart_"
    "and_resume_runs_the_rest"
)
PERIODIC_ARCHIVED_RACE = (
    "tests/test_periodic.py::test_an_enqueuer_that_read_the_schedule_before_a_tick_was_"
    "archived_does_not_run_it_again"
)
PERIODIC_RESET_ROW = "tests/test_periodic.py::test_a_reset_state_row_does_not_enqueue_a_tick_twice"
PAUSE_CLAIM = (
    "tests/test_queue_control_api.py::test_the_claim_leaves_out_a_paused_queue_until_it_is_resumed"
)
LIMIT_CLAIM = (
    "tests/test_queue_control_api.py::"
    "test_a_limited_kind_or_queue_is_claimed_only_by_a_claim_that_holds_its_lock"
)
JOB_CONTROL = "tests/test_job_control.py"
SNOOZE = (
    f"{JOB_CONTROL}::"
    "test_snooze_runs_the_job_again_without_spending_an_attempt_and_rolls_back_its_writes"
)
DISCARD = f"{JOB_CONTROL}::test_discard_ends_the_job_cancelled_at_once_without_its_writes"
RETRY_IN = f"{JOB_CONTROL}::test_retry_in_spends_the_attempt_and_waits_the_chosen_delay"
RESULT = f"{JOB_CONTROL}::test_a_returned_value_is_stored_with_the_done_mark_and_read_back"
STOPS = f"{REL}/test_job_control.py"
HUNG = f"{STOPS}::test_a_hung_handler_is_stopped_at_its_timeout_and_its_writes_roll_back"
PLAIN_LATE_RETURN = (
    f"{STOPS}::test_a_plain_handler_that_returns_after_its_deadline_fails_and_its_writes_roll_back"
)
STARTED_LATE = (
    f"{STOPS}::"
    "test_a_statement_started_late_is_cancelled_at_the_deadline_not_a_timeout_after_its_start"
)
FROZEN_DEADLINE = (
    f"{STOPS}::"
    "test_the_database_stops_a_handlers_statement_at_its_deadline_even_with_the_worker_frozen"
)
CANCEL_RUNNING = f"{STOPS}::test_cancelling_a_running_job_stops_it_rolls_back_and_never_retries"
CANCEL_LATENCY = f"{STOPS}::test_a_cancel_stops_a_running_statement_long_before_the_next_heartbeat"
HOT_HEARTBEATS = "tests/test_horizon.py::test_heartbeats_are_hot_updates_under_a_pinned_horizon"
RELEASED_STEP = "tests/test_horizon.py::" + (
    "test_a_released_workflow_step_is_ready_from_its_release_so_a_floored_claim_finds_it"
)
FLOOR_STRAGGLER = (
    "tests/test_horizon.py::test_a_job_ready_below_the_floor_is_claimed_by_the_next_full_claim"
)
LIMITED_FLOOR_STRAGGLER = (
    "tests/test_horizon.py::"
    "test_a_limited_kinds_job_ready_below_its_floor_is_claimed_by_its_next_full_claim"
)
FULL_CLAIM_BOUND = (
    "tests/test_horizon.py::"
    "test_a_job_ready_below_the_floor_waits_at_most_the_bound_however_long_full_claims_take"
)
FULL_CLAIM_PERIOD = (
    "tests/test_horizon.py::test_full_claims_come_less_often_as_they_cost_more_up_to_the_bound"
)
ASYNC = f"{REL}/test_async_handlers.py"
ASYNC_KILL_STORM = f"{ASYNC}::test_kill_storm_of_async_workers_loses_no_job_and_doubles_no_effect"
ASYNC_STALE = f"{ASYNC}::test_stale_async_worker_resumed_after_takeover_is_fenced_and_rolls_back"

SUPERVISOR = "sqla_jobs/worker/_supervisor.py"
DISPATCHER = "sqla_jobs/worker/_dispatcher.py"
CLAIM_GENERIC_PLAN = (
    "tests/test_fence_plans.py::test_the_prepared_claim_of_an_idle_worker_runs_its_generic_plan"
)
SCHEDULED_BESIDE_READY = "tests/test_scheduled_wakeup.py::" + (
    "test_a_delayed_job_enqueued_beside_a_ready_one_starts_on_time_while_that_one_runs"
)
EXECUTOR = "sqla_jobs/worker/_executor.py"
INFLIGHT = "sqla_jobs/worker/_inflight.py"
SERVICES = "sqla_jobs/worker/_services.py"
CONNLOST = "sqla_jobs/worker/_connlost.py"
SESSION = "sqla_jobs/worker/_session.py"
PRODUCER = "sqla_jobs/producer.py"
ENQUEUE_SQL = "sqla_jobs/sql/enqueue.py"
LEASE = "sqla_jobs/sql/lease.py"
CONTROL_SQL = "sqla_jobs/sql/control.py"
PERIODIC_SQL = "sqla_jobs/sql/periodic.py"
PERIODIC = "sqla_jobs/periodic.py"
LIMITS = "sqla_jobs/worker/_limits.py"
FLOORS = "sqla_jobs/worker/_floors.py"
COMPLETER = "sqla_jobs/worker/_completer.py"
CONTROL = "sqla_jobs/control.py"
ASYNC_EXECUTOR = "sqla_jobs/worker/_async_executor.py"
#: The release function as it runs now (revision 0020 replaced 0014's and 0019's).
RESOLVE_MIGRATION = "sqla_jobs/migrations/versions/0020_fan_out_release.py"
ADMIN_SQL = "sqla_jobs/sql/admin.py"
#: Leaf steps and the deferred trigger of an appended edge (revision 0021).
LEAF_MIGRATION = "sqla_jobs/migrations/versions/0021_leaf_steps.py"


def _drop_from_fence(call: str, *words: str) -> str:
    """A fenced statement's conditions without those that mention any of ``words``."""
    test = " or ".join(f'"{w}" in str(c)' for w in words)
    return f"    conditions = [c for c in {call} if not ({test})]  # MUTATION\n"


@dataclass(frozen=True)
class Mutation:
    name: str
    #: The promise the guard keeps (README "Guarantees" / "Signals" / "Handlers").
    guard: str
    path: str
    #: Exact text, present exactly once in ``path``.
    original: str
    replacement: str
    #: Scenarios run against the mutated copy; older ones first, so the report shows
    #: which of them (if any) already noticed.
    tests: tuple[str, ...]


# Anchors into the fenced statements (sqla_jobs/sql/lease.py): each statement's first
# line, with enough of what follows to be unique.
_COMPLETE = (
    "    conditions = _fence(worker, leases)\n"
    "    return (\n"
    "        sa.update(jobs)\n"
    "        .where(*conditions)\n"
    "        .values(\n"
    "            status=_common.status(JobStatus.DONE)"
)
_HEARTBEAT = (
    "    conditions = _fence(worker, leases)\n"
    "    return (\n"
    "        sa.update(jobs)\n"
    "        .where(*conditions)\n"
    "        .values(\n"
    "            locked_until="
)
_RELEASE = (
    "    conditions = _fence(worker, leases)\n"
    "    cancelled = jobs.c.cancel_requested_at.is_not(None)\n"
)
_FENCE_CALL = "    conditions = _fence(worker, leases)\n"
_RETRY_CALL = "    conditions = _fence(worker, [(job_id, attempt)])\n    ends = _ends_now()\n"
_ONE_ATTEMPT = '            jobs.c.attempts == sa.bindparam("attempt", attempt, sa.Integer),\n'
_ONE_RUNNING = "            _common.still_running(),\n"
_ONE_WORKER = '            jobs.c.worker == sa.bindparam("fence_worker", worker, sa.Text),\n'


def _in_statement(anchor: str, *words: str) -> str:
    return anchor.replace(_FENCE_CALL, _drop_from_fence("_fence(worker, leases)", *words))


# The partitioned archive (#25, revision 0022).
_PARTS = "tests/test_archive_partitions.py::"
PARTS_MIGRATION = "sqla_jobs/migrations/versions/0022_partitioned_archive.py"
PARTS_PREPARED = _PARTS + "test_archive_creates_the_partition_of_its_week_before_moving_rows"
PARTS_DROP_BOUND = _PARTS + "test_drop_before_keeps_a_partition_whose_bound_is_after_the_cutoff"
PARTS_APPENDED = _PARTS + (
    "test_a_partition_holding_a_workflow_appended_to_after_archiving_is_not_dropped"
)
PARTS_ID_CHECKS = _PARTS + "test_a_look_up_by_id_reads_only_the_closed_partition_that_can_hold_it"
PARTS_HEALTH = _PARTS + "test_health_sums_the_partitions_of_the_archive"
PARTS_READER = _PARTS + (
    "test_a_long_reader_of_a_closed_partition_delays_its_id_check_not_the_archive"
)
PARTS_EXECUTE = _PARTS + "test_a_role_with_only_connect_cannot_drop_or_make_archive_partitions"
HEALTH_AUTOVACUUM_OFF = (
    "tests/test_health.py::"
    "test_with_autovacuum_off_a_queue_table_with_many_dead_tuples_is_a_vacuum_finding_at_once"
)
HEALTH_STALE_LISTED = (
    "tests/test_health.py::"
    "test_with_no_live_worker_the_ready_age_and_stale_worker_advice_say_start_one"
)
PARTS_FUTURE = _PARTS + "test_prepare_and_drop_before_refuse_a_future_time"
PARTS_MISSING = _PARTS + (
    "test_an_archive_whose_partition_went_missing_prepares_again_and_moves_its_rows"
)

MUTATIONS: list[Mutation] = [
    # --- shutdown: buffered jobs given back, attempt not spent --------------------------
    Mutation(
        "give_back_on_shutdown",
        "SIGTERM gives back claimed jobs no handler started (the supervisor's drain)",
        SUPERVISOR,
        "            self._completer.release(unstarted)\n",
        "            pass  # MUTATION\n",
        (SHUTDOWN,),
    ),
    Mutation(
        "give_back_spends_no_attempt",
        "a job given back on shutdown keeps its attempt (lease.release)",
        LEASE,
        "            attempts=jobs.c.attempts - 1,\n",
        "            attempts=jobs.c.attempts,  # MUTATION\n",
        (SHUTDOWN,),
    ),
    Mutation(
        "unstarted_claim_released_by_handler",
        "a job a handler thread took after the signal is given back, not run (executor)",
        EXECUTOR,
        "        if self.draining.is_set():\n            # Claimed but not started before shutdown",
        "        if False:  # MUTATION\n            # Claimed but not started before shutdown",
        (SHUTDOWN,),
    ),
    # --- fences -------------------------------------------------------------------------
    Mutation(
        "done_fence_one",
        "the done-mark in the handler's transaction matches worker and attempt",
        LEASE,
        _ONE_ATTEMPT + _ONE_RUNNING + _ONE_WORKER,
        _ONE_RUNNING,
        (STALE_AFTER_DONE, FENCED_TAKEOVER),
    ),
    Mutation(
        "done_fence_one_worker",
        "... its worker condition alone (same attempt: a dead job retried by an operator)",
        LEASE,
        _ONE_ATTEMPT + _ONE_RUNNING + _ONE_WORKER,
        _ONE_ATTEMPT + _ONE_RUNNING,
        (STALE_AFTER_DONE, FENCED_TAKEOVER),
    ),
    Mutation(
        "done_fence_one_attempt",
        "... its attempt condition alone (same worker id: a restarted worker keeps its name)",
        LEASE,
        _ONE_ATTEMPT + _ONE_RUNNING + _ONE_WORKER,
        _ONE_RUNNING + _ONE_WORKER,
        (STALE_AFTER_DONE, FENCED_TAKEOVER),
    ),
    Mutation(
        "done_mark_stops_the_commit",
        "a done-mark sent with the commit that finds the claim lost stops that commit",
        LEASE,
        '                else_=sa.func.concat(_text(CLAIM_LOST + " "), ours),\n',
        "                else_=sa.literal_column(\"'0'\", sa.Text),  # MUTATION\n",
        (STALE_AFTER_DONE, FENCED_TAKEOVER),
    ),
    Mutation(
        "done_fence_batch",
        "the batched done-mark (handlers that wrote nothing) matches worker and attempt",
        LEASE,
        _COMPLETE,
        _in_statement(_COMPLETE, "attempt", "worker"),
        (STALE_AFTER_DONE, FENCED_TAKEOVER),
    ),
    Mutation(
        "done_fence_batch_worker",
        "... its worker condition alone",
        LEASE,
        _COMPLETE,
        _in_statement(_COMPLETE, "worker"),
        (STALE_AFTER_DONE, FENCED_TAKEOVER),
    ),
    Mutation(
        "done_fence_batch_attempt",
        "... its attempt condition alone",
        LEASE,
        _COMPLETE,
        _in_statement(_COMPLETE, "attempt"),
        (STALE_AFTER_DONE, FENCED_TAKEOVER),
    ),
    Mutation(
        "retry_fence",
        "recording a failed attempt matches worker and attempt",
        LEASE,
        _RETRY_CALL,
        _drop_from_fence("_fence(worker, [(job_id, attempt)])", "attempt", "worker")
        + "    ends = _ends_now()\n",
        (STALE_AFTER_DONE, FENCED_TAKEOVER),
    ),
    Mutation(
        "release_fence",
        "the shutdown give-back matches worker and attempt",
        LEASE,
        _RELEASE,
        _in_statement(_RELEASE, "attempt", "worker"),
        (SHUTDOWN, STALE_AFTER_DONE, FENCED_TAKEOVER),
    ),
    Mutation(
        "heartbeat_fence",
        "the heartbeat extends only leases that are still this worker's",
        LEASE,
        _HEARTBEAT,
        _in_statement(_HEARTBEAT, "attempt", "worker"),
        (STALE_AFTER_DONE, NO_OVERLAP, FENCED_TAKEOVER, FENCED_HEARTBEAT),
    ),
    # --- leases -------------------------------------------------------------------------
    Mutation(
        "heartbeat_renewal",
        "the heartbeat renews the lease of every job held (no second run while one is alive)",
        SERVICES,
        "        leases = self.ledger.leases()\n        if not leases:\n            return\n",
        "        leases = self.ledger.leases()\n        if True:  # MUTATION\n            return\n",
        (NO_OVERLAP,),
    ),
    Mutation(
        "heartbeat_ledger_per_claim",
        "a stale run's end leaves this worker's newer claim of the job in the heartbeat",
        INFLIGHT,
        "                entry = self._jobs.pop(job.lease, None)\n",
        # The ledger by job id alone: the end of a claim removes the job's newer claim.
        "                entry = self._jobs.pop(job.lease, None)\n"
        "                for key in [k for k in self._jobs if k[0] == job.id]:  # MUTATION\n"
        "                    del self._jobs[key]\n",
        (FENCED_HEARTBEAT, NEW_RUN_HEARTBEAT),
    ),
    Mutation(
        "lease_rescue",
        "expired leases are requeued (a killed worker's job runs again)",
        SUPERVISOR,
        "            Rescuer(draining, self.engine, self.config, self._wake),\n",
        "            # MUTATION: no rescuer\n",
        (POISON, STALE_AFTER_DONE),
    ),
    Mutation(
        "poison_goes_dead",
        "a lease that expires on the last attempt makes the job dead (no endless poison)",
        LEASE,
        "        (jobs.c.attempts >= jobs.c.max_attempts, _common.status(JobStatus.DEAD)),\n",
        "        (sa.false(), _common.status(JobStatus.DEAD)),  # MUTATION\n",
        (POISON,),
    ),
    # --- notifications ------------------------------------------------------------------
    Mutation(
        "listener_wakeup",
        "a notification wakes the dispatcher (jobs picked up without waiting for a poll)",
        SERVICES,
        "                else:\n                    self.wake()\n",
        "                else:\n                    pass  # MUTATION\n",
        (BUSY_LISTENER_FAULT, IDLE_LISTENER_FAULT),
    ),
    Mutation(
        "due_look_put_off_unbounded",
        "a look for the next due time put off past a round that filed jobs is made within "
        "DUE_LOOK_DELAY_SECONDS, not only at the next round that files nothing",
        DISPATCHER,
        " " * 24 + "self._due_look_at = now + (DUE_LOOK_DELAY_SECONDS if filed else 0.0)\n",
        " " * 24 + 'self._due_look_at = now + (float("inf") if filed else 0.0)  # MUTATION\n',
        (SCHEDULED_BESIDE_READY,),
    ),
    Mutation(
        "claim_levels_end_at_a_parameter",
        "the prepared claim of an idle worker runs its generic plan, not a new plan each time",
        LEASE,
        "    levels = _common.priority_levels()\n    max_priority = ",
        "    levels = (  # MUTATION: the bound as generate_series' upper end\n"
        '        sa.func.generate_series(0, sa.bindparam("max_priority", 9, sa.Integer))\n'
        '        .table_valued("level")\n'
        '        .render_derived(name="levels")\n'
        "    )\n"
        "    max_priority = ",
        (CLAIM_GENERIC_PLAN,),
    ),
    Mutation(
        "listener_reconnect_poll",
        "a listener that reconnects polls once (notifications sent meanwhile were lost)",
        SERVICES,
        "            self.wake()  # notifications sent while we were away are lost: poll\n",
        "            pass  # MUTATION\n",
        (LISTENER_AWAY,),
    ),
    Mutation(
        "idle_flag_after_reconnect",
        "after the listener reconnects the idle flag is raised again (producers notify)",
        DISPATCHER,
        "        self._idle_flag_suspect = True\n",
        "        pass  # MUTATION\n",
        (BUSY_BACKENDS_FAULT, IDLE_BACKENDS_FAULT, IDLE_RESTART),
    ),
    Mutation(
        "commits_in_flight_waited_out",
        "a worker going idle waits out the commits that decided not to notify, then claims",
        DISPATCHER,
        "            return bool(self._idle_conn.execute(locks.no_commit_in_flight()).scalar())\n",
        "            return True  # MUTATION\n",
        (COMMIT_IN_FLIGHT,),
    ),
    # --- the handler's transaction ------------------------------------------------------
    Mutation(
        "handler_commit_refused",
        "session.commit() in a handler raises HandlerTransactionError",
        SESSION,
        '    def commit(self) -> None:\n        self._violate("session.commit()")\n',
        "    def commit(self) -> None:\n        self.worker_commit()  # MUTATION\n",
        (MISBEHAVING,),
    ),
    Mutation(
        "swallowed_commit_fails_the_attempt",
        "a handler that ended (or tried to end) its transaction fails its attempt",
        SESSION,
        "    problem = refused\n",
        "    return  # MUTATION\n    problem = refused\n",
        (MISBEHAVING,),
    ),
    Mutation(
        "base_exceptions_are_failures",
        "SystemExit, KeyboardInterrupt and BaseException fail the attempt, not the worker",
        EXECUTOR,
        "        except BaseException as exc:  # SystemExit and KeyboardInterrupt too",
        "        except Exception as exc:  # MUTATION",
        (MISBEHAVING,),
    ),
    Mutation(
        "handler_writes_committed",
        "what a handler wrote through its session is committed (with the done-mark)",
        SESSION,
        "    wrote = session.in_transaction() or bool(\n"
        "        session.new or session.deleted or (session.identity_map and session.dirty)\n"
        "    )\n",
        "    wrote = False and bool(session.new)  # MUTATION\n",
        (MISBEHAVING,),
    ),
    Mutation(
        "writes_commit_with_the_done_mark",
        "a handler's writes and its done-mark commit in ONE transaction",
        EXECUTOR,
        "            if wrote:\n                session.flush()\n",
        "            if wrote:\n                session.worker_commit()  # MUTATION\n",
        (KILL_POINTS, FENCED_TAKEOVER),
    ),
    # --- limits, rates, pause (revision 0006) --------------------------------------------
    Mutation(
        "operator_limit_first",
        "an operator's limit overrides the code's declared one in every claim",
        CONTROL_SQL,
        "def _effective_concurrency() -> sa.ColumnElement[Any]:\n"
        "    c = queue_controls.c\n"
        "    return sa.func.coalesce(c.concurrency, c.declared_concurrency)\n",
        # The declared limit first in the claims' capacity and room only (the listing of
        # the controls, which has a test of its own, keeps the right order).
        "def _effective_concurrency() -> sa.ColumnElement[Any]:\n"
        "    import sys  # MUTATION\n"
        "    c = queue_controls.c\n"
        "    if sys._getframe(1).f_code.co_name in ('capacity', 'room'):\n"
        "        return sa.func.coalesce(c.declared_concurrency, c.concurrency)\n"
        "    return sa.func.coalesce(c.concurrency, c.declared_concurrency)\n",
        (OPERATOR_LIMIT,),
    ),
    Mutation(
        "pause_holds_back",
        "no claim takes a job of a paused queue or kind",
        CONTROL_SQL,
        "        sa.or_(\n            c.paused,\n",
        "        sa.or_(\n            sa.false(),  # MUTATION\n",
        (PAUSE_CLAIM, PAUSE),
    ),
    Mutation(
        "limit_needs_its_lock",
        "a limited kind or queue is claimed only by a claim holding its lock",
        CONTROL_SQL,
        "                _limited(),\n",
        "                sa.false(),  # MUTATION\n",
        (LIMIT_CLAIM, KIND_LIMIT),
    ),
    Mutation(
        "reserve_gate",
        "a worker starts held-back jobs of a limit only within its gate (the limit holds)",
        LIMITS,
        "        count = min(len(reserve), self._gate(group) - running)\n",
        "        count = len(reserve)  # MUTATION\n",
        (RESERVE_GATE, HELD_BACK),
    ),
    Mutation(
        "rate_counts_starts",
        "a rate limit counts the starts in its window",
        LIMITS,
        "                left = r.rate_count - int(r.started)\n",
        "                left = r.rate_count  # MUTATION\n",
        (RATE,),
    ),
    # --- periodic schedules (revision 0004) ---------------------------------------------
    Mutation(
        "periodic_row_lock",
        "a tick runs once even after its job was archived (the schedule row's lock)",
        PERIODIC_SQL,
        "        .with_for_update(skip_locked=True)\n",
        "",
        (PERIODIC_ARCHIVED_RACE,),
    ),
    Mutation(
        "periodic_tick_key",
        "a tick runs once even if its schedule's row was reset (the tick's key)",
        PERIODIC,
        "            key=tick_key(self.name, tick),\n",
        "            key=None,  # MUTATION\n",
        (PERIODIC_RESET_ROW,),
    ),
    # --- timeouts and cancelling (revision 0005) ------------------------------------------
    Mutation(
        "timeout_applies",
        "a handler's timeout stops it (job.check(), its statement)",
        EXECUTOR,
        "        control = Control(job.timeout if job.timeout is not None else handler.timeout)\n",
        "        control = Control(None)  # MUTATION\n",
        (HUNG,),
    ),
    Mutation(
        "returned_late_fails",
        "a handler that returns after its deadline fails its attempt (writes rolled back)",
        SESSION,
        "    if stop is not None:  # it returned, but too late or after a cancel\n",
        "    if False:  # MUTATION\n",
        (PLAIN_LATE_RETURN,),
    ),
    Mutation(
        "deadline_watch_cancels_statement",
        "a statement a handler runs is cancelled at the deadline, however late it began",
        SERVICES,
        "        for control in self.ledger.expiring():\n",
        "        for control in []:  # MUTATION\n",
        (HUNG, STARTED_LATE),
    ),
    Mutation(
        "statement_timeout_set",
        "the database stops the handler's statement at the deadline (statement_timeout)",
        SESSION,
        '        conn.execute(lease.statement_timeout(ms), {"ms": ms})\n',
        "        pass  # MUTATION\n",
        (HUNG, FROZEN_DEADLINE),
    ),
    Mutation(
        "cancel_stops_the_run",
        "an operator's cancel stops the running handler and ends the job cancelled",
        CONTROL,
        "        if self.cancel_requested_at is not None:\n            return JobCancelled(",
        "        if False:  # MUTATION\n            return JobCancelled(",
        (CANCEL_RUNNING,),
    ),
    Mutation(
        "listener_cancel",
        "a cancel reaches a running job at once by notification, not at the next heartbeat",
        SERVICES,
        "                if note.channel == self.cancel_channel:\n"
        "                    self._cancel(note.payload)\n",
        "                if note.channel == self.cancel_channel:\n"
        "                    pass  # MUTATION\n",
        (CANCEL_RUNNING, CANCEL_LATENCY),
    ),
    # --- the handler's decisions and results (revision 0005) -----------------------------
    Mutation(
        "snooze_spends_no_attempt",
        "Snooze runs the job again later without spending an attempt",
        LEASE,
        "            attempts=sa.case((cancelled, jobs.c.attempts), else_=jobs.c.attempts - 1),\n",
        "            attempts=jobs.c.attempts,  # MUTATION\n",
        (SNOOZE,),
    ),
    Mutation(
        "discard_ends_cancelled",
        "Discard ends the job cancelled at once, not retried",
        COMPLETER,
        "            elif isinstance(exc, (Discard, JobCancelled)):\n",
        "            elif isinstance(exc, JobCancelled):  # MUTATION\n",
        (DISCARD,),
    ),
    Mutation(
        "retry_in_delay",
        "RetryIn retries after the delay the handler chose, not the backoff",
        COMPLETER,
        "exc.seconds if isinstance(exc, RetryIn) else handler.backoff.delay(job.attempt)",
        "handler.backoff.delay(job.attempt)  # MUTATION",
        (RETRY_IN,),
    ),
    Mutation(
        "result_with_the_done_mark",
        "a handler's return value is stored with its done-mark",
        EXECUTOR,
        "and (attempt.wrote or attempt.result is not None):\n",
        "and attempt.wrote:  # MUTATION\n",
        (RESULT,),
    ),
    # --- async handlers ------------------------------------------------------------------
    Mutation(
        "async_writes_commit_with_the_done_mark",
        "an async handler's writes and its done-mark commit in ONE transaction",
        ASYNC_EXECUTOR,
        "            if wrote:\n                await session.flush()\n",
        "            if wrote:  # MUTATION\n"
        "                await session.run_sync(lambda s: s.worker_commit())\n",
        (ASYNC_KILL_STORM, ASYNC_STALE),
    ),
    # --- enqueue (no worker involved: in-process tests) ----------------------------------
    Mutation(
        "enqueue_joins_the_callers_transaction",
        "enqueue never commits: the job commits or rolls back with the caller's work",
        PRODUCER,
        "    return conn.exec_driver_sql(*_driver_call(conn.dialect, shape, stmt, params))\n",
        "    result = conn.exec_driver_sql(*_driver_call(conn.dialect, shape, stmt, params))\n"
        "    conn.commit()  # MUTATION\n"
        "    return result\n",
        (ENQUEUE_ROLLBACK, ENQUEUE_NO_COMMIT),
    ),
    # --- a taken idempotency key never aborts the caller's transaction (#21) -------------
    Mutation(
        "taken_key_no_conflict_error",
        "enqueue's insert skips a taken key (ON CONFLICT DO NOTHING) instead of raising",
        ENQUEUE_SQL,
        "        .on_conflict_do_nothing(index_elements=[jobs.c.idempotency_key])\n",
        "",
        (TAKEN_KEY_ANY_STYLE,),
    ),
    Mutation(
        "taken_key_orm_style",
        "... and so does session.add(Job(key=...)): the flush inserts it as enqueue does",
        "sqla_jobs/models.py",
        'sa.event.listen(Session, "before_flush", _route_new_jobs)\n',
        "# MUTATION: Job objects with a key are left to the ORM's plain INSERT\n",
        (TAKEN_KEY_ANY_STYLE,),
    ),
    # --- #23: a plain job flushed by enqueue's statement is left as the ORM's insert leaves it
    Mutation(
        "orm_flush_fills_every_column",
        "a job the flush inserted by enqueue's statement holds every column (NULL unless "
        "set), so an AsyncSession reads it without a query",
        PRODUCER,
        "        for name in _NULL_UNLESS_SET:\n            values.setdefault(name, None)\n",
        "        pass  # MUTATION: columns the table does not fill are left unloaded\n",
        (
            "tests/test_orm_enqueue.py::test_a_flushed_job_is_read_without_a_query_as_the_"
            "orms_own_insert_leaves_it",
            "tests/test_orm_enqueue.py::test_a_flushed_plain_job_holds_the_rows_values_as_"
            "after_the_orms_insert",
        ),
    ),
    # --- #21: the statement's time in long transactions; handler defaults (in-process) ---
    Mutation(
        "done_mark_dated_by_its_statement",
        "finished_at is the done-mark's time, not the handler transaction's start",
        LEASE,
        "            status=_common.status(JobStatus.DONE),\n"
        "            finished_at=_common.clock(now),\n",
        "            status=_common.status(JobStatus.DONE),\n"
        "            finished_at=sa.func.now(),  # MUTATION\n",
        (
            f"{TIMESTAMPS}::test_finished_at_is_when_the_done_mark_ran_not_when_the_handlers_"
            "transaction_began",
        ),
    ),
    Mutation(
        "clock_is_the_statements_time",
        "delay= and operators' retry, cancel and pause count from their statement",
        "sqla_jobs/sql/_common.py",
        "        return sa.func.statement_timestamp(type_=sa.DateTime(timezone=True))\n",
        "        return sa.func.now()  # MUTATION\n",
        (
            f"{TIMESTAMPS}::test_a_job_enqueued_late_in_a_handlers_transaction_is_dated_from_"
            "its_enqueue",
            f"{TIMESTAMPS}::test_operator_actions_in_a_long_transaction_are_dated_when_they_run",
        ),
    ),
    Mutation(
        "column_defaults_are_the_statements_time",
        "created_at and the default run_at are the enqueue statement's time (revision 0008)",
        "sqla_jobs/migrations/versions/0008_handler_defaults.py",
        '    actions = _defaults("statement_timestamp()")\n',
        '    actions = _defaults("now()")  # MUTATION\n',
        (
            f"{TIMESTAMPS}::test_a_job_enqueued_late_in_a_handlers_transaction_is_dated_from_"
            "its_enqueue",
        ),
    ),
    Mutation(
        "claim_resolves_handler_max_attempts",
        "a job enqueued without max_attempts gets its handler's when claimed",
        LEASE,
        "            max_attempts=_resolved_max_attempts(max_attempts or {}),\n",
        "            max_attempts=sa.func.coalesce(jobs.c.max_attempts, 8),  # MUTATION\n",
        (HANDLER_MAX_ATTEMPTS,),
    ),
    Mutation(
        "limited_claims_resolve_handler_max_attempts",
        "the claims of limited kinds give a job its handler's max_attempts too",
        "sqla_jobs/worker/_limits.py",
        "                    max_attempts=self.registry.max_attempts_by_kind(),\n",
        "                    max_attempts=None,  # MUTATION\n",
        (f"{HANDLER_MAX_ATTEMPTS}[limited_once]",),
    ),
    Mutation(
        "worker_warns_about_unserved_queues",
        "a worker warns about ready jobs of its kinds in a queue it does not serve",
        SERVICES,
        "            found = conn.execute(self.statement).all()\n",
        "            found = []  # MUTATION\n",
        (UNSERVED_WARNING,),
    ),
    Mutation(
        "unserved_warning_once_per_kind_and_queue",
        "the unserved-queue warning comes once per kind and queue, not every round",
        SERVICES,
        "            if (row.kind, row.queue) in self.warned:\n                continue\n",
        "            if False:  # MUTATION\n                continue\n",
        (UNSERVED_WARNING,),
    ),
    Mutation(
        "stats_list_unserved_jobs",
        "stats lists ready jobs no live worker running their kind serves",
        "sqla_jobs/ops.py",
        "        if k.ready and k.kind in served and k.queue not in served[k.kind]\n",
        "        if False  # MUTATION\n",
        (
            "tests/test_handler_defaults.py::"
            "test_stats_list_ready_jobs_that_no_live_worker_running_their_kind_serves",
        ),
    ),
    Mutation(
        "supervisor_unstarted_child_clean",
        "--processes: a child stopped by SIGTERM before it started held no job: exit 0",
        "sqla_jobs/_procs.py",
        "            child.exits[-1] = 0\n",
        "            pass  # MUTATION\n",
        ("tests/test_processes.py::test_sigterm_before_the_worker_processes_started_exits_zero",),
    ),
    # --- the dashboard at size (#22) -----------------------------------------------------
    Mutation(
        "jobs_page_led_by_its_filter_index",
        "a jobs page filtered by kind, queue or status is ordered by (column, id), so only "
        "that column's index gives its order (statistics cannot send it down the primary key)",
        "sqla_jobs/sql/admin.py",
        "    order: list[sa.ColumnElement[Any]] = "
        "[jobs.c.id] if lead is None else [lead, jobs.c.id]\n",
        "    order: list[sa.ColumnElement[Any]] = [jobs.c.id]  # MUTATION\n",
        (
            "tests/test_dashboard_plans.py::"
            "test_each_jobs_page_filter_reads_its_index_whatever_the_statistics",
        ),
    ),
    Mutation(
        "payload_matches_step_hides_its_value",
        "a containment filter's second step hides its value from the planner (an InitPlan), "
        "so statistics taken when the value was on every row cannot make it read the table",
        "sqla_jobs/sql/admin.py",
        "    return sa.select(value).scalar_subquery() if all_matches else value\n",
        "    return value  # MUTATION\n",
        (
            "tests/test_dashboard_plans.py::"
            "test_each_jobs_page_filter_reads_its_index_whatever_the_statistics"
            "[payload-value-on-every-row]",
        ),
    ),
    Mutation(
        "estimate_marks_follow_live_counts",
        "the overview's ≈ marks are shown and hidden by the live counts, not only at render",
        "sqla_jobs/dashboard/static/dashboard.js",
        "      mark.hidden = !estimates.includes(mark.dataset.estimate);\n",
        "      // MUTATION: the marks stay as drawn\n",
        (
            "tests/test_dashboard_browser.py::"
            "test_the_estimate_marks_follow_the_counts_live_without_a_reload",
        ),
    ),
    Mutation(
        "queue_row_dead_link_follows_live_counts",
        "the overview's per-queue Dead cell becomes a link to the queue's dead jobs live",
        "sqla_jobs/dashboard/static/dashboard.js",
        "        if (cell.dataset.link && value) {\n",
        "        if (false) {  // MUTATION\n",
        (
            "tests/test_dashboard_browser.py::"
            "test_a_queue_rows_dead_link_and_oldest_ready_follow_the_counts_live",
        ),
    ),
    Mutation(
        "queue_row_oldest_ready_in_live_counts",
        "the counts event carries each queue's oldest ready age, so its cell follows it",
        "sqla_jobs/dashboard/_live.py",
        '        q["oldest"] = _render.age(oldest.get(name))\n',
        '        q["oldest"] = "-"  # MUTATION\n',
        (
            "tests/test_dashboard_browser.py::"
            "test_a_queue_rows_dead_link_and_oldest_ready_follow_the_counts_live",
        ),
    ),
    Mutation(
        "stats_statement_reused_with_each_reads_instant",
        "ops.stats reuses its built statement but gives it each read's own instant",
        "sqla_jobs/ops.py",
        '            for row in conn.execute(statement, {"taken_at": taken_at}):\n',
        '            for row in conn.execute(statement, {"taken_at": taken_at.replace(second=0)}):'
        "  # MUTATION\n",
        (
            "tests/test_ops.py::"
            "test_stats_figures_refer_to_each_reads_own_instant_though_its_statement_is_reused",
        ),
    ),
    Mutation(
        "age_bound_walks_every_hour_past_it",
        "an age filter's page walks between the lowest id created since its newer_than bound "
        "and the highest created before its older_than one, over every hour past the bound "
        "(exact when created_at is out of step with id), not only the bound's own hour",
        "sqla_jobs/sql/admin.py",
        "    ids = sa.union_all(sa.select(walk.c.id), sa.select(edge.subquery().c.id)).subquery(\n",
        "    ids = sa.select(edge.subquery().c.id).subquery(  # MUTATION\n",
        (
            "tests/test_ops_dashboard_queries.py::"
            "test_newer_than_pages_are_exact_when_created_at_is_out_of_step_with_id",
            "tests/test_ops_dashboard_queries.py::"
            "test_older_than_pages_are_exact_when_created_at_is_out_of_step_with_id",
        ),
    ),
    Mutation(
        "overview_estimates_above_its_bound",
        "the overview counts a family exactly up to its bound and estimates it above",
        "sqla_jobs/ops.py",
        "        if exact_up_to is not None and seen > exact_up_to:\n",
        "        if False:  # MUTATION\n",
        ("tests/test_dashboard_estimates.py",),
    ),
    # --- the attempt history (revision 0011) ---------------------------------------------
    Mutation(
        "attempt_errors_kept",
        "each failed attempt's error is kept in the job's history (lease.record_failure)",
        LEASE,
        "            errors=_attempt_ended(FAILED, error_text, _failed_status(), now),\n",
        "            # MUTATION: the failed attempt leaves no entry\n",
        (
            "tests/test_attempt_history.py::"
            "test_a_dead_job_keeps_the_error_of_every_attempt_and_a_long_one_is_cut_to_its_end",
        ),
    ),
    # --- health (issue #25) ----------------------------------------------------------------
    Mutation(
        "health_names_the_horizon_holder",
        "health names the session whose snapshot holds the horizon (sql.health)",
        "sqla_jobs/sql/health.py",
        "            sa.or_(activity.c.backend_xmin.is_not(None), "
        "activity.c.backend_xid.is_not(None)),\n",
        "            activity.c.backend_xid.is_not(None),  # MUTATION: snapshots not seen\n",
        (
            "tests/test_health.py::"
            "test_health_names_the_repeatable_read_transaction_holding_the_horizon",
        ),
    ),
    Mutation(
        "health_fails_over_a_threshold",
        "a check over its threshold is a finding and `sqla-jobs health` exits 1 (cli)",
        "sqla_jobs/cli.py",
        "    return 0 if snapshot.ok else EXIT_UNHEALTHY\n",
        "    return 0  # MUTATION\n",
        (
            "tests/test_health.py::"
            "test_health_command_exits_1_naming_the_pid_and_age_and_0_when_healthy",
        ),
    ),
    Mutation(
        "health_leaves_itself_out",
        "health does not report its own connection as a horizon holder (sql.health)",
        "sqla_jobs/sql/health.py",
        "            activity.c.pid != sa.func.pg_backend_pid(),\n",
        "            sa.true(),  # MUTATION\n",
        ("tests/test_health.py::test_health_leaves_out_its_own_connection_and_committed_sessions",),
    ),
    # --- job metadata (revision 0013, #27) ---------------------------------------------
    Mutation(
        "meta_size_limit",
        "a job's meta is at most MAX_META_BYTES as JSON, refused at enqueue",
        "sqla_jobs/validation.py",
        '    text = _dump_object("meta", meta, MAX_META_BYTES)\n',
        '    text = _dump_object("meta", meta, MAX_PAYLOAD_BYTES)  # MUTATION\n',
        (
            "tests/test_job_meta.py::"
            "test_bad_metadata_is_refused_at_enqueue_and_the_transaction_stays_usable",
        ),
    ),
    Mutation(
        "handler_sees_meta",
        "the handler reads its job's meta (job.meta) in a worker",
        INFLIGHT,
        "            meta=self.meta or {},\n",
        "            meta={},  # MUTATION\n",
        ("tests/test_job_meta.py::test_handlers_read_meta_and_tags_in_a_real_worker",),
    ),
    Mutation(
        "tags_filter",
        "list_jobs(tag=...) keeps only the jobs with that tag",
        "sqla_jobs/sql/admin.py",
        "        conditions.append(jobs.c.tags.contains(_hidden(tags_match, all_matches)))\n",
        "        pass  # MUTATION\n",
        (
            "tests/test_job_meta.py::"
            "test_list_jobs_filters_by_tag_and_meta_and_archived_jobs_keep_them",
        ),
    ),
    Mutation(
        "meta_filter_reads_every_match",
        "a meta filter that is not a page near the cursor reads every match from its index",
        "sqla_jobs/sql/admin.py",
        "        any(c is not None for c in contains) and _leading_filter(",
        "        contains[0] is not None and _leading_filter(  # MUTATION\n       ",
        (
            "tests/test_dashboard_plans.py::"
            "test_each_jobs_page_filter_reads_its_index_whatever_the_statistics",
        ),
    ),
    # --- OpenTelemetry tracing (#27) ---------------------------------------------------
    Mutation(
        "otel_no_span_without_an_sdk",
        "with the API and no SDK an attempt builds no span (no tracer, no context switch)",
        "sqla_jobs/_otel.py",
        "    if api is None or _no_sdk(api[0]):\n",
        "    if api is None:  # MUTATION\n",
        ("tests/test_tracing.py::test_with_the_api_and_no_sdk_an_attempt_builds_no_span",),
    ),
    Mutation(
        "otel_nothing_without_a_span",
        "an enqueue with no current span records no span and stores no trace context",
        "sqla_jobs/_otel.py",
        "    if not given and not current.is_valid:\n        return meta\n",
        "    pass  # MUTATION\n",
        (
            "tests/test_tracing.py::"
            "test_no_trace_context_is_stored_without_a_current_span_as_for_a_periodic_tick",
        ),
    ),
    Mutation(
        "otel_process_span_continues_the_trace",
        "the worker's process span is a child of the enqueuing request's trace",
        "sqla_jobs/_otel.py",
        "        context=parent,\n",
        "        context=None,  # MUTATION\n",
        (
            "tests/test_tracing.py::"
            "test_one_trace_runs_from_the_request_through_enqueue_to_the_handler_in_another_process",
        ),
    ),
    Mutation(
        "otel_context_at_insert_not_construction",
        "building a NewJob in a span records nothing: the context is taken at insert",
        "sqla_jobs/producer.py",
        '        object.__setattr__(self, "meta_json", validation.dump_meta(self.meta))\n',
        '        object.__setattr__(self, "meta_json", validation.dump_meta('
        "_otel.with_trace_context(self.meta, self.queue)))  # MUTATION\n",
        (
            "tests/test_tracing.py::"
            "test_a_job_built_in_a_span_but_never_inserted_records_no_publish_span",
        ),
    ),
    Mutation(
        "otel_flush_takes_the_context",
        "jobs the ORM's own insert writes get the flushing code's trace context",
        "sqla_jobs/producer.py",
        "    _add_trace_context(session, instances, pending)\n",
        "    pass  # MUTATION\n",
        (
            "tests/test_tracing.py::"
            "test_the_stored_context_is_the_inserting_codes_not_the_building_codes",
        ),
    ),
    Mutation(
        "otel_meta_limit_before_the_context",
        "the meta size limit is the application's: the trace context an insert adds comes "
        "on top (enqueue, enqueue_many, workflows, periodic, the flush as enqueue does)",
        "sqla_jobs/producer.py",
        "    return job.meta_json if meta is job.meta else validation.dump_traced_meta(meta)\n",
        "    return job.meta_json if meta is job.meta else validation.dump_meta(meta)  # MUTATION"
        "\n",
        (
            "tests/test_tracing.py::"
            "test_a_meta_at_the_size_limit_is_accepted_inside_a_span_on_every_route",
        ),
    ),
    Mutation(
        "otel_flush_context_past_the_meta_limit",
        "the flush adds the trace context to a Job the ORM inserts past meta's validator "
        "(its size limit is the application's meta's)",
        "sqla_jobs/producer.py",
        '                obj.__dict__["meta"] = traced\n',
        "                obj.meta = traced  # MUTATION\n",
        (
            "tests/test_tracing.py::"
            "test_a_meta_at_the_size_limit_is_accepted_inside_a_span_on_every_route",
        ),
    ),
    Mutation(
        "otel_flush_routed_jobs_traced_once",
        "a Job the flush inserts as enqueue does gets its context (one publish span) from "
        "that insert, not a second one before it",
        "sqla_jobs/producer.py",
        "    skip = {id(job) for job in routed}\n",
        "    skip: set[int] = set()  # MUTATION\n",
        (
            "tests/test_tracing.py::"
            "test_a_meta_at_the_size_limit_is_accepted_inside_a_span_on_every_route",
        ),
    ),
    Mutation(
        "otel_tracestate_bounded",
        "the tracestate an insert stores is cut to MAX_TRACESTATE_BYTES as W3C says",
        "sqla_jobs/_otel.py",
        "    if size(entries) <= limit:\n",
        "    if True:  # MUTATION\n",
        (
            "tests/test_tracing.py::"
            "test_the_trace_context_stored_is_bounded_however_large_the_current_tracestate",
        ),
    ),
    Mutation(
        "otel_given_traceparent_parents_the_publish",
        "a traceparent the application put in meta is the parent of the job's publish span",
        "sqla_jobs/_otel.py",
        "        context=given_context,\n",
        "        context=None,  # MUTATION\n",
        (
            "tests/test_tracing.py::"
            "test_a_traceparent_given_in_meta_is_the_parent_of_the_jobs_publish_span",
        ),
    ),
    Mutation(
        "meta_trace_keys_checked",
        "a traceparent or tracestate given in meta must be well formed (W3C), refused at "
        "enqueue naming the key and the format",
        "sqla_jobs/validation.py",
        "        _check_trace_context(meta)\n",
        "        pass  # MUTATION\n",
        (
            "tests/test_job_meta.py::"
            "test_bad_metadata_is_refused_at_enqueue_and_the_transaction_stays_usable",
            "tests/test_tracing.py::"
            "test_a_malformed_traceparent_in_meta_is_refused_inside_a_span_too",
        ),
    ),
    Mutation(
        "meta_limit_without_the_context",
        "a meta's trace context keys do not count towards its size limit (a handler "
        "passing job.meta on to a follow-up job)",
        "sqla_jobs/validation.py",
        "        own = {k: v for k, v in meta.items() if k != TRACEPARENT and k != TRACESTATE}\n",
        "        own = meta  # MUTATION\n",
        (
            "tests/test_tracing.py::"
            "test_a_meta_at_the_size_limit_is_accepted_inside_a_span_on_every_route",
        ),
    ),
    Mutation(
        "tags_set_refused",
        "tags given as a set (no order) are refused",
        "sqla_jobs/validation.py",
        "    if isinstance(tags, (set, frozenset)):\n",
        "    if False:  # MUTATION\n",
        (
            "tests/test_job_meta.py::"
            "test_bad_metadata_is_refused_at_enqueue_and_the_transaction_stays_usable",
        ),
    ),
    Mutation(
        "tags_comma_refused",
        "a tag with a comma (which would read as two tags where tags are listed) is refused",
        "sqla_jobs/validation.py",
        '        if "," in tag:\n',
        "        if False:  # MUTATION\n",
        (
            "tests/test_job_meta.py::"
            "test_bad_metadata_is_refused_at_enqueue_and_the_transaction_stays_usable",
        ),
    ),
    Mutation(
        "otel_queue_wait_from_the_claim",
        "the process span's queue wait is the claim's, by the database's clock",
        "sqla_jobs/_otel.py",
        "        attributes[QUEUE_WAIT] = job.waited\n",
        "        attributes[QUEUE_WAIT] = 0.0  # MUTATION\n",
        (
            "tests/test_tracing.py::"
            "test_the_process_span_tells_the_time_in_queue_by_the_databases_clock_not_the_workers",
        ),
    ),
    Mutation(
        "otel_span_tells_retry_from_dead",
        "a failed attempt's process span records whether the job was retried or is dead "
        "(thread and async handlers: the completer records it)",
        "sqla_jobs/worker/_completer.py",
        "            _otel.settled(attempt.span, outcome)\n",
        "            _otel.settled(  # MUTATION\n"
        "                attempt.span, Outcome.RETRY if outcome is Outcome.DEAD else outcome\n"
        "            )\n",
        (
            "tests/test_tracing.py::"
            "test_each_retry_is_a_process_span_of_the_same_trace_with_the_error_recorded",
        ),
    ),
    Mutation(
        "otel_async_attempt_carries_its_span",
        "an async handler's attempt takes its process span to the completer, which records "
        "the outcome on it",
        "sqla_jobs/worker/_async_executor.py",
        "        return attempt._replace(span=span)\n",
        "        return attempt  # MUTATION\n",
        (
            "tests/test_tracing.py::"
            "test_each_retry_is_a_process_span_of_the_same_trace_with_the_error_recorded",
        ),
    ),
    Mutation(
        "otel_batched_done_mark_on_the_span",
        "a handler that wrote nothing: its span ends after the batch done-mark, with the "
        "batch's outcome (done or lost) on it",
        "sqla_jobs/worker/_completer.py",
        "        if attempt.span is not None:\n"
        "            attempt.span.hand_over()  # before the put: the batch may end it at once\n",
        "        pass  # MUTATION\n",
        (
            "tests/test_tracing.py::"
            "test_every_path_that_marks_a_job_done_records_it_on_the_process_span",
            "tests/test_tracing.py::"
            "test_a_claim_lost_at_a_batched_or_child_done_mark_is_on_the_process_span",
        ),
    ),
    Mutation(
        "otel_lost_claim_on_the_span",
        "a lost claim sets its process span's status to ERROR",
        "sqla_jobs/_otel.py",
        '    if value == "lost":\n',
        "    if False:  # MUTATION\n",
        (
            "tests/test_tracing.py::"
            "test_a_lost_claim_is_an_event_and_the_error_status_of_its_process_span",
        ),
    ),
    Mutation(
        "otel_given_up_outcome_on_the_span",
        "a handler the worker gave up on: its span ends with what the worker recorded "
        "then (retry, dead), not as a lost claim when the handler comes back",
        "sqla_jobs/worker/_completer.py",
        "            _otel.given_up(attempt.span, self._given_up.pop(job.lease, None))\n"
        "            self._emit(Outcome.LOST, attempt._replace(span=None))\n",
        "            self._emit(Outcome.LOST, attempt)  # MUTATION\n",
        (
            "tests/test_tracing.py::"
            "test_a_handler_the_worker_gave_up_on_has_the_given_up_runs_outcome_on_its_span",
        ),
    ),
    Mutation(
        "otel_process_span_is_current_in_the_handler",
        "the handler's session SQL (instrumented SQLAlchemy) nests under the process span",
        "sqla_jobs/_otel.py",
        "        with trace.use_span(\n"
        "            span, end_on_exit=False, record_exception=True, set_status_on_exception=True\n"
        "        ):\n"
        "            yield traced\n",
        "        if True:  # MUTATION\n            yield traced\n",
        (
            "tests/test_tracing.py::"
            "test_the_handlers_session_sql_nests_under_the_process_span_with_sqlalchemy_instrumented",
        ),
    ),
    Mutation(
        "otel_isolated_child_gets_the_context",
        "a process-isolated handler's own spans nest under its attempt's process span",
        "sqla_jobs/worker/_isolated.py",
        '        "trace": _otel.carrier(),\n',
        '        "trace": {},  # MUTATION\n',
        (
            "tests/test_tracing.py::"
            "test_a_handler_in_a_child_process_runs_in_the_process_span_of_its_attempt",
        ),
    ),
    # --- workflows (#26) -----------------------------------------------------------------
    Mutation(
        "workflow_release_waits_for_every_edge",
        "a step is released only when every dependency has ended (jobs_workflow_resolve)",
        RESOLVE_MIGRATION,
        "    WHERE j.id = ANY(near) AND j.status = 'waiting'\n      AND NOT EXISTS (",
        "    WHERE j.id = ANY(near) AND j.status = 'waiting'\n      AND true OR NOT EXISTS (",
        (FLOW_FAN_IN, FLOW_STORM),
    ),
    Mutation(
        "workflow_child_locked_before_its_edges_are_read",
        "two parents ending at once: the child's row lock makes exactly one release it",
        RESOLVE_MIGRATION,
        "      ORDER BY j.id FOR UPDATE OF j) AS locked;",
        "      ORDER BY j.id) AS locked;  -- MUTATION",
        (FLOW_CONCURRENT_PARENTS, FLOW_STORM),
    ),
    Mutation(
        "workflow_cancel_is_transitive",
        "the dependents of a cancelled step are resolved in the same transaction",
        RESOLVE_MIGRATION,
        "    frontier := cancelled;\n",
        "    frontier := '{{}}';  -- MUTATION\n",
        (FLOW_TRANSITIVE,),
    ),
    Mutation(
        "workflow_deleted_dependency_is_a_failure",
        "a deleted dependency cancels its dependents, as a dead one does",
        RESOLVE_MIGRATION,
        "             coalesce(p.status::text, a.status::text, 'deleted') AS outcome,",
        "             coalesce(p.status::text, a.status::text, 'done') AS outcome,  -- MUTATION",
        (FLOW_DELETED,),
    ),
    Mutation(
        "workflow_released_alone_only_with_one_dependency",
        "a step is released with its edge unwritten only when its one dependency ended",
        RESOLVE_MIGRATION,
        "                WHERE o.child_id = x.child_id AND o.parent_id <> x.parent_id)) AS alone",
        "                WHERE false)) AS alone  -- MUTATION",
        (FLOW_FAN_IN, FLOW_CONCURRENT_PARENTS),
    ),
    Mutation(
        "workflow_released_alone_only_after_done",
        "a step whose one dependency failed is not released alone (it is cancelled)",
        RESOLVE_MIGRATION,
        "             (x.requires <> 'failed' AND "
        "coalesce(p.status::text, a.status::text, '') = 'done'",
        "             (x.requires <> 'failed'  -- MUTATION",
        (FLOW_TRANSITIVE,),
    ),
    Mutation(
        "workflow_sweep_skips_steps_released_alone",
        "the sweep's room goes to waiting steps, not to the unwritten edges of released ones",
        "sqla_jobs/sql/workflows.py",
        "        .where(child.c.status == _common.status(JobStatus.WAITING))\n",
        "",
        (FLOW_RELEASED_ALONE, FLOW_SWEEP),
    ),
    Mutation(
        "workflow_waits_on_no_ended_parent",
        "a step released alone waits on nothing (its unwritten edge's parent ended)",
        "sqla_jobs/sql/workflows.py",
        "                .filter(parent.c.status.not_in(_statuses(*models.FINISHED_STATUSES))),\n",
        "                ,\n",
        (FLOW_RELEASED_ALONE,),
    ),
    Mutation(
        "workflow_parent_is_never_a_leaf",
        "a step another step depends on is listed when it ends (workflow_leaf false)",
        "sqla_jobs/workflows.py",
        '                "l": name not in parents,\n',
        '                "l": True,  # MUTATION\n',
        (FLOW_FAN_IN, FLOW_LEAVES),
    ),
    Mutation(
        "workflow_append_clears_the_leaf",
        "a step appended after a leaf is released when that leaf ends later",
        LEAF_MIGRATION,
        "  UPDATE jobs SET workflow_leaf = false WHERE id = NEW.parent_id AND workflow_leaf;\n",
        "",
        (FLOW_APPENDED, FLOW_LEAVES),
    ),
    Mutation(
        "workflow_append_resolves_an_ended_leaf_at_commit",
        "a step appended after a leaf that ended in the append's transaction, or while it "
        "was open, is released at the append's commit",
        LEAF_MIGRATION,
        "  PERFORM jobs_workflow_resolve(ARRAY[NEW.parent_id]);\n",
        "",
        (FLOW_LEAF_SELF, FLOW_LEAF_MEANWHILE),
    ),
    Mutation(
        "workflow_stale_done_releases_nothing",
        "a stale worker's step releases nothing: the release runs only when the fenced "
        "done-mark changed the row",
        LEASE,
        _ONE_ATTEMPT + _ONE_RUNNING + _ONE_WORKER,
        _ONE_RUNNING,
        (FLOW_STALE, FLOW_STALE_PROCESS),
    ),
    Mutation(
        "workflow_callback_requires_its_policy",
        "an on-failure step is cancelled when every dependency ended done",
        RESOLVE_MIGRATION,
        "      FROM unneeded AS u\n      WHERE j.id = u.c\n",
        "      FROM unneeded AS u\n      WHERE false  -- MUTATION\n",
        (FLOW_CALLBACKS,),
    ),
    Mutation(
        "archiver_keeps_unfinished_workflows",
        "the archiver's batch skips the rows of a workflow that has not ended (so they"
        " never fill it and hold up other jobs)",
        ADMIN_SQL,
        "    ready = sa.and_(sa.not_(workflows.unfinished_workflow(jobs)), last_end < done_age)\n",
        "    ready = last_end < done_age  # MUTATION\n",
        (FLOW_ARCHIVER, FLOW_ARCHIVER_PROGRESS),
    ),
    Mutation(
        "archive_takes_whole_workflows",
        "the archiver and prune take every step of a workflow their batch touched",
        ADMIN_SQL,
        "            sa.select(*(locked.c[k] for k in key))"
        ".where(locked.c.workflow_id.in_(whole)),\n",
        "            sa.select(*(picked.c[k] for k in key))"
        ".where(picked.c.workflow_id.is_not(None)),  # MUT\n",
        (FLOW_ARCHIVE_WHOLE, FLOW_PRUNE_WHOLE),
    ),
    Mutation(
        "archive_unit_needs_every_step_locked",
        "a workflow one of whose steps is locked elsewhere or may not go yet stays whole",
        ADMIN_SQL,
        "        .having(sa.and_(sa.func.bool_and(locked.c.goes), sa.func.count() == all_steps))\n",
        "        .having(sa.true())  # MUTATION\n",
        (FLOW_ARCHIVE_LOCKED, FLOW_PRUNE_WHOLE, FLOW_ARCHIVER),
    ),
    Mutation(
        "prune_deletes_by_id_alone",
        "a prune batch deletes each row from its own partition (by id and archived_at)",
        ADMIN_SQL,
        "        .where(archive.c.id == chosen.c.id, archive.c.archived_at == chosen.c.archived_at)"
        "\n",
        "        .where(archive.c.id == chosen.c.id)  # MUTATION\n",
        (PRUNE_OWN_PARTITION, FLOW_PRUNE_WHOLE),
    ),
    Mutation(
        "batches_start_at_the_floor",
        "each batch of a long archive or prune starts where the previous one stopped (it"
        " does not walk the dead index entries the earlier batches left)",
        ADMIN_SQL,
        '        if name.startswith("reached") and value is not None:\n',
        "        if False:  # MUTATION\n",
        (FLOORS_PRUNE, FLOORS_ARCHIVE, FLOW_ARCHIVE_WHOLE, FLOW_PRUNE_WHOLE),
    ),
    Mutation(
        "batches_without_jit",
        "an archive or prune batch is never JIT-compiled (on a long history compiling it"
        " cost more than running it)",
        "sqla_jobs/ops.py",
        '    session.execute(workflows_sql.set_jit("off"))  # SET LOCAL: until the commit\n',
        "    pass  # MUTATION\n",
        (FLOORS_NO_JIT,),
    ),
    Mutation(
        "append_holds_its_workflow",
        "a step appended to a finished workflow is not split from it by a concurrent archiver",
        "sqla_jobs/workflows.py",
        "        conn.execute(workflows_sql.hold_steps(workflow_id, models.jobs))\n",
        "        pass  # MUTATION\n",
        (FLOW_APPEND_WHILE_ARCHIVING,),
    ),
    Mutation(
        "append_holds_its_archived_workflow",
        "a step appended to an archived workflow is not split from it by a concurrent prune",
        "sqla_jobs/workflows.py",
        "        conn.execute(workflows_sql.hold_steps(workflow_id, models.jobs_archive))\n",
        "        pass  # MUTATION\n",
        (FLOW_APPEND_WHILE_ARCHIVING,),
    ),
    Mutation(
        "workflow_sweep_resolves_missed_parents",
        "the sweep resolves ended parents whose edges are still open",
        "sqla_jobs/sql/workflows.py",
        "        .where(workflow_edges.c.parent_outcome.is_(None), "
        "sa.or_(parent.c.id.is_(None), ended))",
        "        .where(sa.false())  # MUTATION",
        (FLOW_SWEEP,),
    ),
    Mutation(
        "workflow_retry_needs_its_permission",
        "the dashboard's workflow retry is behind the retry permission",
        "sqla_jobs/dashboard/_app.py",
        '            action("retry")(views.retry_workflow),\n',
        '            action("pause")(views.retry_workflow),  # MUTATION\n',
        (FLOW_DASHBOARD_PERMISSIONS,),
    ),
    Mutation(
        "workflow_page_hides_actions_not_permitted",
        "the workflow page shows its cancel button only to a viewer who may cancel",
        "sqla_jobs/dashboard/templates/workflow.html",
        '  {% if viewer.can("cancel") and not flow.finished %}{{ button(',
        "  {% if not flow.finished %}{{ button(",
        (FLOW_DASHBOARD_BUTTONS,),
    ),
    Mutation(
        "stats_count_waiting_steps",
        "ops.stats counts waiting workflow steps",
        "sqla_jobs/ops.py",
        '    ((JobStatus.WAITING,), stats_sql.stats_waiting, ("waiting",)),\n',
        "",
        (FLOW_STATS_WAITING,),
    ),
    Mutation(
        "retry_jobs_reopens_cancelled_dependents",
        "retrying a workflow step reopens the steps its failure cancelled, in its transaction",
        "sqla_jobs/ops.py",
        "            _reopen_downstream(session, steps)\n",
        "            pass  # MUTATION\n",
        (FLOW_RETRY_REOPENS,),
    ),
    Mutation(
        "retry_jobs_keeps_steps_another_failure_cancelled",
        "a step that also depends on a failed step not retried stays cancelled",
        "sqla_jobs/sql/workflows.py",
        "            sa.not_(failed_elsewhere),\n",
        "            sa.true(),  # MUTATION\n",
        (FLOW_RETRY_BLOCKED,),
    ),
    Mutation(
        "retry_jobs_refuses_a_step_whose_dependency_failed",
        "ops.retry_jobs does not queue a step whose dependency failed and is not retried with it",
        "sqla_jobs/ops.py",
        "            _refuse_failed_dependencies(session, steps)\n",
        "            pass  # MUTATION\n",
        (FLOW_RETRY_REFUSED,),
    ),
    Mutation(
        "retry_jobs_step_waits_for_its_retried_dependency",
        "a step retried with its failed dependency waits for it instead of running beside it",
        "sqla_jobs/ops.py",
        "            session.execute(workflows_sql.wait_again(steps))\n",
        "            pass  # MUTATION\n",
        (FLOW_RETRY_REFUSED,),
    ),
    # --- dashboard: no-op actions, the unserved note (#22) ---------------------------------
    Mutation(
        "control_change_only_when_different",
        "a control change writes (and reports a change) only when a value differs",
        "sqla_jobs/sql/control.py",
        "        where=sa.or_(*(queue_controls.c[k].is_distinct_from(stmt.excluded[k]) "
        "for k in values)),\n"
        "    ).returning(queue_controls.c.scope)",
        "    ).returning(queue_controls.c.scope)  # MUTATION",
        (CONTROL_NO_CHANGE, DASHBOARD_NO_CHANGE),
    ),
    Mutation(
        "dashboard_records_changes_only",
        "the dashboard records a queue or kind action only when it changed something",
        "sqla_jobs/dashboard/_views.py",
        "            if changed:\n"
        '                action = "clear-limits" if verb == "clear" else verb\n'
        "                _record(",
        "            if True:  # MUTATION\n"
        '                action = "clear-limits" if verb == "clear" else verb\n'
        "                _record(",
        (DASHBOARD_NO_CHANGE,),
    ),
    Mutation(
        "dashboard_notes_unserved",
        "the dashboard notes a paused or limited name no live worker serves (ops.unserved)",
        "sqla_jobs/dashboard/_views.py",
        "            unserved = ops.unserved(session, **{scope: name}) "
        "if verb in WARN_UNSERVED else None\n",
        "            unserved = None  # MUTATION\n",
        (DASHBOARD_UNSERVED,),
    ),
    # --- dashboard: a new user's trial (#22) ---------------------------------------------
    Mutation(
        "dashboard_workflow_retry_needs_a_mode",
        "a workflow retry form naming no known mode is refused, not given a default",
        "sqla_jobs/dashboard/_views.py",
        '        mode = form.get("mode", "")\n        if mode not in ops.RETRY_MODES:\n',
        '        mode = form.get("mode", "failed")\n        if mode not in ops.RETRY_MODES:\n',
        (
            "tests/test_dashboard_workflows.py::"
            "test_a_workflow_retry_without_a_known_mode_is_refused_and_does_nothing",
        ),
    ),
    Mutation(
        "dashboard_bulk_offers_applicable_actions",
        "a jobs page offers only the bulk actions that can apply to its jobs' status",
        "sqla_jobs/dashboard/_bulk.py",
        "    return [op for op, statuses in APPLIES_TO.items() "
        "if status is None or status in statuses]\n",
        "    return list(APPLIES_TO)  # MUTATION\n",
        (
            "tests/test_dashboard_bulk.py::"
            "test_a_jobs_page_offers_only_the_bulk_actions_that_can_apply_to_its_jobs",
        ),
    ),
    Mutation(
        "workflow_dependencies_in_id_order",
        "a step's dependencies are listed in job id order, which a retry does not change",
        "sqla_jobs/sql/workflows.py",
        "                        workflow_edges.c.parent_id,\n                    )\n"
        '                ),\n                sa.cast(sa.literal("{}"), ARRAY(sa.Text)),\n'
        "            )\n        )\n        .select_from(workflow_edges.outerjoin(",
        "                        sa.literal(0),  # MUTATION\n                    )\n"
        '                ),\n                sa.cast(sa.literal("{}"), ARRAY(sa.Text)),\n'
        "            )\n        )\n        .select_from(workflow_edges.outerjoin(",
        (
            "tests/test_dashboard_workflows.py::test_a_steps_dependencies_keep_their_order_after_a_retry",
        ),
    ),
    # --- failover and network faults (#24) -----------------------------------------------
    Mutation(
        "read_only_is_a_lost_connection",
        "25006 (a read-only node) is a lost connection: dropped, reconnected, no attempt spent",
        CONNLOST,
        'LOST_SQLSTATES = frozenset({"25006", "57P01", "57P02", "57P03"})\n',
        'LOST_SQLSTATES = frozenset({"57P01", "57P02", "57P03"})  # MUTATION\n',
        (READ_ONLY_NODE,),
    ),
    Mutation(
        "listener_probe",
        "the listener proves its connection with a self-NOTIFY; a dead socket is left",
        SERVICES,
        "        self.probe_every: float | None = config.listener_probe_interval\n",
        "        self.probe_every: float | None = None  # MUTATION\n",
        (DEAD_LISTEN_SOCKET,),
    ),
    Mutation(
        "idle_flag_retaken_after_failover",
        "the idle flag (a session lock) is taken again on the new primary after a failover",
        DISPATCHER,
        "                    self._drop_idle_flag()  # raised again below, on a new connection\n",
        "                    pass  # MUTATION\n",
        (IDLE_FAILOVER, SYNC_FAILOVER),
    ),
    Mutation(
        "engine_passed_in_gets_keepalives",
        "an engine passed to Worker(engine=...) gets the TCP keepalive defaults it does not set",
        "sqla_jobs/_tcp.py",
        '    sa.event.listen(engine, "do_connect", _default_keepalives)\n',
        "    pass  # MUTATION\n",
        (ENGINE_KEEPALIVES,),
    ),
    Mutation(
        "engine_without_keepalives_warned",
        "an engine whose connections bypass the TCP defaults (its own creator) is warned about",
        CONNLOST,
        '    sa.event.listen(engine, "connect", _warn_without_keepalives, once=True)\n',
        "    pass  # MUTATION\n",
        (ENGINE_KEEPALIVES_WARNING,),
    ),
    Mutation(
        "listener_backoff_reset_on_reconnect",
        "a listener that reconnected backs off from the shortest pause at its next outage",
        SERVICES,
        "            failed = self.settled()\n",
        "            failed = 0  # MUTATION\n",
        (
            "tests/test_services.py::"
            "test_the_listeners_backoff_starts_again_from_the_shortest_pause_after_it_reconnected",
        ),
    ),
    Mutation(
        "listener_probe_timeout_setting",
        "the listener gives an unanswered probe up after listener_probe_timeout, not a constant",
        SERVICES,
        "        self.probe_timeout = config.listener_probe_timeout\n",
        "        self.probe_timeout = 5.0  # MUTATION\n",
        (PROBE_TIMEOUT_SETTING,),
    ),
    Mutation(
        "outcome_unknown_gives_back_a_few_times",
        "a job whose connection is lost while its outcome is recorded is given back at most "
        "MAX_LOST_GIVEBACKS times, then its run is a failed attempt (not running for ever)",
        COMPLETER,
        "            if not self._may_give_back(job.id):\n"
        "                self._lost_while_recording(job, exc)\n"
        "                return\n",
        "            pass  # MUTATION\n",
        (
            "tests/test_worker_process.py::"
            "test_a_connection_lost_while_recording_the_outcome_fails_the_job_after_its_give_backs",
        ),
    ),
    Mutation(
        "health_visibility_finding",
        "health run by a role that cannot see other roles' sessions says so (a finding)",
        "sqla_jobs/_health.py",
        "    if h.sees_other_roles:\n        return []\n",
        "    if True:  # MUTATION\n        return []\n",
        (
            "tests/test_health.py::"
            "test_health_without_pg_read_all_stats_says_it_cannot_see_other_roles_transactions",
        ),
    ),
    Mutation(
        "health_inactive_slot_without_xmin",
        "health flags an inactive replication slot that holds no xmin (it retains WAL)",
        "sqla_jobs/sql/health.py",
        "                sa.not_(slots.c.active),\n",
        "                sa.false(),  # MUTATION\n",
        (
            "tests/test_health.py::"
            "test_an_inactive_replication_slot_without_xmin_is_flagged_with_the_wal_it_retains",
        ),
    ),
    Mutation(
        "health_never_vacuumed_aged_from_stats",
        "a never-vacuumed table's age counts from when its database's statistics began",
        "sqla_jobs/_health.py",
        "    since = vacuumed if vacuumed is not None else h.stats_since\n",
        "    since = vacuumed  # MUTATION\n",
        (
            "tests/test_health.py::"
            "test_a_never_vacuumed_table_is_as_old_as_its_databases_statistics",
        ),
    ),
    Mutation(
        "worker_archives_dead_after",
        "a worker started with --archive-dead-after archives dead and cancelled jobs too",
        SERVICES,
        "                        session, self.older_than, include_dead_after=self.dead_after\n",
        "                        session, self.older_than, include_dead_after=None  # MUTATION\n",
        (
            "tests/test_ops_cli.py::"
            "test_worker_archives_dead_and_cancelled_jobs_only_with_archive_dead_after",
        ),
    ),
    Mutation(
        "timed_out_socket_is_a_lost_connection",
        "a socket ended without a server answer (tcp_user_timeout) is a lost connection: "
        "the job is given back, no attempt spent",
        CONNLOST,
        "            if isinstance(exc, psycopg.OperationalError) and exc.sqlstate is None:\n",
        "            if False:  # MUTATION\n",
        (FROZEN_HANDLER_LINK,),
    ),
    Mutation(
        "done_mark_prepared_after_restart",
        "the one-job done-mark is prepared on each connection, a restarted server's new ones too",
        COMPLETER,
        "                session.worker_commit(done_mark=(sql, values, "
        "self.config.prepared_statements))\n",
        "                session.worker_commit(done_mark=(sql, values, False))  # MUTATION\n",
        (RESTART_PREPARED,),
    ),
    Mutation(
        "workflow_step_error_is_state_or_history",
        "a retried step that ran again shows its old error as earlier, not as its state",
        "sqla_jobs/ops.py",
        "        return _current_error(self.status, self.attempts, self.snoozes, self.last_error)\n"
        "\n\n@dataclass(frozen=True)\nclass WorkflowStatus:",
        "        return self.last_error  # MUTATION\n"
        "\n\n@dataclass(frozen=True)\nclass WorkflowStatus:",
        (FLOW_CLI_ERRORS,),
    ),
    Mutation(
        "workflow_flags_refused",
        "sqla-jobs workflow refuses a flag the action does not take",
        "sqla_jobs/cli.py",
        '        _check_workflow_flags(commands["workflow"], args)\n',
        "        pass  # MUTATION\n",
        (FLOW_CLI_FLAGS,),
    ),
    Mutation(
        "list_jobs_workflow_order_not_from_the_primary_key",
        "a workflow's page is read from its index: its order is no walk of the primary key",
        "sqla_jobs/sql/admin.py",
        "    keyed = jobs.c.id + 0\n",
        "    keyed = jobs.c.id  # MUTATION\n",
        (FLOW_CLI_INDEX,),
    ),
    Mutation(
        "payload_window_shortcut_only_at_the_edge",
        "a payload filter skips its GIN step only when its id window reached the table's edge",
        "sqla_jobs/sql/admin.py",
        "    return highest <= start + PAYLOAD_WINDOW\n",
        "    return True  # MUTATION\n",
        (
            "tests/test_ops_dashboard_queries.py::"
            "test_a_payload_filters_pages_near_the_table_edge_are_exact_and_the_far_ones_too",
        ),
    ),
    Mutation(
        "registry_forget_skips_locked_rows",
        "a heartbeat forgetting expired workers skips rows another heartbeat holds (no deadlock)",
        "sqla_jobs/sql/workers.py",
        "        .with_for_update(skip_locked=True)\n",
        "  # MUTATION\n",
        (
            "tests/test_worker_registry.py::"
            "test_two_late_heartbeats_forgetting_each_others_expired_row_do_not_wait_on_each_other",
        ),
    ),
    Mutation(
        "cancel_leaves_waiting_steps",
        "a waiting workflow step can be cancelled (its dependents follow the workflow rules)",
        "sqla_jobs/sql/admin.py",
        "    statuses = [JobStatus.QUEUED, JobStatus.WAITING]\n",
        "    statuses = [JobStatus.QUEUED]  # MUTATION\n",
        (TRIAL_WAITING_CANCEL,),
    ),
    Mutation(
        "delete_refusal_names_other_states",
        "the CLI's and dashboard's refusals list the states ops applies the action to",
        "sqla_jobs/cli.py",
        "    allowed = [s.value for s in ops.ACTION_STATUSES[action]]\n",
        '    allowed = ["queued", "done", "dead", "cancelled"]  # MUTATION\n',
        (TRIAL_ACTION_TEXT,),
    ),
    Mutation(
        "json_filter_recursion_uncaught",
        "a JSON filter nested too deeply is a clean refusal naming the filter, not a 500",
        "sqla_jobs/validation.py",
        "    except RecursionError:\n        # The decoder (and the walk)",
        "    except ZeroDivisionError:  # MUTATION\n        # The decoder (and the walk)",
        (TRIAL_DEEP_FILTER,),
    ),
    Mutation(
        "filter_value_unchecked",
        "a jobs filter no job can match (enqueue's rules) is refused naming it and the rule",
        "sqla_jobs/dashboard/_forms.py",
        "    return validation.filter_value(name, _label(name), text, ConfigError)\n",
        "    return text  # MUTATION\n",
        (TRIAL_NO_MATCH,),
    ),
    Mutation(
        "timeout_shown_without_the_handlers",
        "a job without a timeout of its own shows its handler's, said to be the handler's",
        "sqla_jobs/ops.py",
        "    declared = registry[job.kind].timeout\n",
        "    declared = None  # MUTATION\n",
        (TRIAL_TIMEOUT,),
    ),
    Mutation(
        "multipart_form_read_as_tokenless",
        "a form not sent urlencoded is refused saying so, not as a missing CSRF token",
        "sqla_jobs/dashboard/_forms.py",
        "    if media != URLENCODED:\n",
        "    if False:  # MUTATION\n",
        (TRIAL_MULTIPART,),
    ),
    Mutation(
        "periodic_times_on_two_clocks",
        "a schedule's next and last tick are shown in the same zone, the schedule's",
        "sqla_jobs/dashboard/_render.py",
        "    return moment(value.astimezone(where))\n",
        "    return moment(value)  # MUTATION\n",
        (TRIAL_ZONE,),
    ),
    Mutation(
        "ended_step_still_waits",
        "a workflow step that ended waits on nothing (cancelled while a dependency ran)",
        "sqla_jobs/dashboard/_render.py",
        "        waiting = () if s.status in models.FINISHED_STATUSES else s.waiting_on\n",
        "        waiting = s.waiting_on  # MUTATION\n",
        (TRIAL_ENDED_WAITS,),
    ),
    Mutation(
        "workflow_page_counts_not_live",
        "a workflow page's counts and waits-on follow its steps' live states without a reload",
        "sqla_jobs/dashboard/static/dashboard.js",
        "    onWorkflow(jobs);\n",
        "    // MUTATION: no onWorkflow\n",
        (BROWSER_FLOW_LIVE,),
    ),
    Mutation(
        "dashboard_stop_waits_for_the_live_read",
        "a stopping dashboard cancels the live view's query in flight instead of waiting for it",
        "sqla_jobs/dashboard/_live.py",
        "                reading.cancel()\n",
        "                pass  # MUTATION\n",
        (DASHBOARD_STOPS_MID_ROUND,),
    ),
    # --- a pinned horizon (#25) -------------------------------------------------------------
    Mutation(
        "lease_index_kept",
        "no index holds the lease: a heartbeat is a HOT update (revision 0018)",
        "sqla_jobs/migrations/versions/0018_hot_heartbeats.py",
        '        _autocommit([f"DROP INDEX CONCURRENTLY IF EXISTS {name}" for name in DROPPED])\n',
        "        pass  # MUTATION\n",
        (HOT_HEARTBEATS,),
    ),
    Mutation(
        "claim_floor_never_falls_back",
        "a job ready below the claim's floor is claimed by the next full claim (floors)",
        FLOORS,
        "        return now >= self.full_claim_at\n",
        "        return not self.by_priority  # MUTATION\n",
        (FLOOR_STRAGGLER, LIMITED_FLOOR_STRAGGLER),
    ),
    Mutation(
        "full_claim_period_uncapped",
        "a job ready below the floor waits at most FULL_CLAIM_MAX_SECONDS for a full claim",
        FLOORS,
        "    return min(FULL_CLAIM_MAX_SECONDS,"
        " max(FULL_CLAIM_SECONDS, cost / FULL_CLAIM_SHARE))\n",
        "    return max(FULL_CLAIM_SECONDS, cost / FULL_CLAIM_SHARE)  # MUTATION\n",
        (FULL_CLAIM_BOUND, FULL_CLAIM_PERIOD),
    ),
    Mutation(
        "limited_claim_from_the_head",
        "a limited group's claim starts at the group's floors (limits)",
        LIMITS,
        '            "floors": floors,\n',
        '            "floors": None,  # MUTATION\n',
        (LIMITED_FLOOR_STRAGGLER,),
    ),
    Mutation(
        "full_claim_without_timer",
        "a short floored claim sets the timer of the next full claim (an idle worker)",
        FLOORS,
        "                when = self.timer_for_full_claim()\n",
        "                pass  # MUTATION\n",
        (FLOOR_STRAGGLER, LIMITED_FLOOR_STRAGGLER),
    ),
    Mutation(
        "limited_full_claim_without_timer",
        "a limited group's short floored claim sets the timer of its next full claim",
        LIMITS,
        "            self.wake_at(when)\n",
        "            pass  # MUTATION\n",
        (LIMITED_FLOOR_STRAGGLER,),
    ),
    Mutation(
        "released_step_keeps_old_run_at",
        "a workflow step released alone by its one dependency is ready from its release",
        RESOLVE_MIGRATION,
        "SET status = 'queued', run_at = greatest(j.run_at, statement_timestamp())\n",
        "SET status = 'queued'  -- MUTATION\n",
        (RELEASED_STEP + "[released-alone]",),
    ),
    Mutation(
        "released_fan_in_step_keeps_old_run_at",
        "a fan-in's step released by its last dependency is ready from its release",
        RESOLVE_MIGRATION,
        "    UPDATE jobs SET status = 'queued', run_at = greatest(run_at, statement_timestamp())\n",
        "    UPDATE jobs SET status = 'queued'  -- MUTATION\n",
        (RELEASED_STEP + "[fan-in]",),
    ),
    Mutation(
        "archive_prepares_its_partitions",
        "an archive makes its week's partition (jobs_archive_prepare) before it moves rows",
        "sqla_jobs/ops.py",
        "    prepare_archive(session)\n    floors",
        "    pass  # MUTATION\n    floors",
        (PARTS_PREPARED,),
    ),
    Mutation(
        "drop_before_only_partitions_ended_by_the_cutoff",
        "prune drops a partition only when its upper bound is at or before the cutoff",
        PARTS_MIGRATION,
        "           WHERE q.upper_bound <= cutoff LOOP\n",
        "           WHERE q.lower_bound <= cutoff LOOP  -- MUTATION\n",
        (PARTS_DROP_BOUND,),
    ),
    Mutation(
        "drop_before_keeps_appended_workflows",
        "a partition holding a workflow with a step still in jobs is not dropped",
        PARTS_MIGRATION,
        "    CONTINUE WHEN busy;\n",
        "    NULL;  -- MUTATION\n",
        (PARTS_APPENDED,),
    ),
    Mutation(
        "closed_partitions_get_id_checks",
        "a closed partition gets a validated id CHECK, so a look-up by id skips it",
        PARTS_MIGRATION,
        "           WHERE q.upper_bound <= at - interval '{CLOSED_AFTER}'\n",
        "           WHERE false AND q.upper_bound <= at - interval '{CLOSED_AFTER}'  -- MUTATION\n",
        (PARTS_ID_CHECKS,),
    ),
    Mutation(
        "id_check_never_fails_the_archive",
        "an id CHECK whose partition lock is not granted in time is left for a later call;"
        " the archive goes on",
        PARTS_MIGRATION,
        "    EXCEPTION WHEN lock_not_available THEN\n"
        "      NULL;  -- a long reader holds it: the archive goes on, a later call adds it\n",
        "    EXCEPTION WHEN division_by_zero THEN\n      NULL;  -- MUTATION\n",
        (PARTS_READER,),
    ),
    Mutation(
        "health_sums_partitions",
        "health reports a partitioned table as the sum of its partitions",
        "sqla_jobs/sql/health.py",
        "        .outerjoin(tree, tree.c.isleaf)\n",
        "        .outerjoin(tree, sa.false())  # MUTATION\n",
        (PARTS_HEALTH,),
    ),
    Mutation(
        "partition_functions_not_executable_by_public",
        "a role with no privilege on jobs_archive cannot run its SECURITY DEFINER functions",
        PARTS_MIGRATION,
        '        statements.append(f"REVOKE EXECUTE ON FUNCTION {function} FROM PUBLIC")\n',
        "        pass  # MUTATION\n",
        (PARTS_EXECUTE,),
    ),
    Mutation(
        "prepare_refuses_a_future_time",
        "jobs_archive_prepare refuses a time after the clock (it would close open partitions)",
        PARTS_MIGRATION,
        "  IF at > clock_timestamp() THEN\n",
        "  IF false THEN  -- MUTATION\n",
        (PARTS_FUTURE,),
    ),
    Mutation(
        "drop_before_refuses_a_future_cutoff",
        "jobs_archive_drop_before refuses a cutoff after the clock (it would drop this week's"
        " partition)",
        PARTS_MIGRATION,
        "  IF cutoff > clock_timestamp() THEN\n",
        "  IF false THEN  -- MUTATION\n",
        (PARTS_FUTURE,),
    ),
    Mutation(
        "archive_retries_a_missing_partition",
        "an archive batch with no partition for its rows prepares again and is retried once",
        "sqla_jobs/ops.py",
        "            _forget_prepared(session)\n",
        "            raise  # MUTATION\n",
        (PARTS_MISSING,),
    ),
    Mutation(
        "health_flags_dead_tuples_with_autovacuum_off",
        "with autovacuum off, a queue table with 1,000+ dead tuples is a vacuum finding at once",
        "sqla_jobs/_health.py",
        "    if t.dead_tuples >= VACUUM_MIN_DEAD and not (t.server_autovacuum and"
        " t.table_autovacuum):\n",
        "    if False:  # MUTATION\n",
        (HEALTH_AUTOVACUUM_OFF,),
    ),
    Mutation(
        "health_stale_worker_says_workers_lists_it",
        "a stale worker's finding says whether `sqla-jobs workers` still lists it",
        "sqla_jobs/_health.py",
        "        listed = worker.expires_at is not None and worker.expires_at >= h.taken_at\n",
        "        listed = False  # MUTATION\n",
        (HEALTH_STALE_LISTED,),
    ),
]


@dataclass(frozen=True)
class Result:
    name: str
    verdict: str
    failed: list[str]
    seconds: int
    tail: str


IGNORE = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".pgdata",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    "*.egg-info",
)
RUN_TIMEOUT = 1_200


def check_anchors(mutations: list[Mutation], root: Path = ROOT) -> list[str]:
    """One line per mutation whose original text is not in its file exactly once, or
    whose replacement (in a Python file) does not compile."""
    problems = []
    for m in mutations:
        path = root / m.path
        if not path.exists():
            problems.append(f"{m.name}: {m.path} does not exist")
            continue
        text = path.read_text()
        found = text.count(m.original)
        if found != 1:
            problems.append(f"{m.name}: original text found {found} times in {m.path}")
            continue
        if path.suffix != ".py":
            continue  # the browser's script: its test is what checks the mutant runs
        try:
            compile(text.replace(m.original, m.replacement), str(path), "exec")
        except SyntaxError as exc:
            problems.append(f"{m.name}: the mutated {m.path} does not compile: {exc}")
    return problems


def _env(copy: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(copy), env.get("PYTHONPATH")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _imports_copy(copy: Path) -> None:
    """The copy's sqla_jobs is what an interpreter started like a worker imports."""
    out = subprocess.run(
        [sys.executable, "-c", "import sqla_jobs; print(sqla_jobs.__file__)"],
        cwd=copy,
        env=_env(copy),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(out).resolve().is_relative_to(copy.resolve()):
        raise SystemExit(f"the scratch copy is not what gets imported: sqla_jobs from {out}")


def run(
    mutation: Mutation | None, tests: tuple[str, ...], logdir: Path, source: Path = ROOT
) -> Result:
    """Run ``tests`` in a scratch copy of ``source`` with ``mutation`` applied (None: the
    baseline)."""
    name = mutation.name if mutation else "baseline"
    with tempfile.TemporaryDirectory(prefix=f"sqla_jobs_mut_{name}_") as tmp:
        copy = Path(tmp) / "repo"
        shutil.copytree(source, copy, ignore=IGNORE)
        if mutation is not None:
            path = copy / mutation.path
            text = path.read_text()
            assert text.count(mutation.original) == 1, mutation.name
            path.write_text(text.replace(mutation.original, mutation.replacement))
        _imports_copy(copy)
        started = time.monotonic()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", *tests],
                cwd=copy,
                env=_env(copy),
                capture_output=True,
                text=True,
                timeout=RUN_TIMEOUT,
            )
            output, code = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            partial = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
            output, code = f"{partial}\ntimed out after {RUN_TIMEOUT}s", -1
        seconds = round(time.monotonic() - started)
    (logdir / f"{name}.log").write_text(output)
    failed = sorted(set(re.findall(r"^FAILED (\S+?)(?: - .*)?$", output, re.MULTILINE)))
    summary = output.strip().splitlines()[-1] if output.strip() else ""
    if code == 0:
        verdict = "passed" if mutation is None else "SURVIVED"
    elif failed:
        verdict = "FAILED" if mutation is None else "killed"
    else:
        verdict = f"error (pytest exit {code})"
    return Result(name, verdict, failed, seconds, summary)


def _short(nodeid: str) -> str:
    return nodeid.split("::")[-1] if "::" in nodeid else nodeid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check the anchors")
    parser.add_argument("--only", help="comma-separated mutation names")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    parser.add_argument("--logs", type=Path, help="where to keep each run's output")
    parser.add_argument("--list", action="store_true", help="list the mutations")
    args = parser.parse_args(argv)

    mutations = MUTATIONS
    if args.only:
        wanted = args.only.split(",")
        unknown = set(wanted) - {m.name for m in MUTATIONS}
        if unknown:
            parser.error(f"unknown mutation(s): {', '.join(sorted(unknown))}")
        mutations = [m for m in MUTATIONS if m.name in wanted]
    if args.list:
        for m in mutations:
            print(f"{m.name:38} {m.path:24} {m.guard}")
        return 0
    problems = check_anchors(mutations)
    if problems:
        print("anchors moved; update MUTATIONS in tests/reliability/mutations.py:")
        print("\n".join(f"  {p}" for p in problems))
        return 2
    print(f"all {len(mutations)} anchors found once each")
    if args.check:
        return 0

    logdir = args.logs or Path(tempfile.mkdtemp(prefix="sqla_jobs_mutations_"))
    logdir.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(f"commit {commit}, logs in {logdir}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="sqla_jobs_mut_source_") as tmp:
        # Every run copies this snapshot, so edits made to the tree meanwhile do not leak in.
        source = Path(tmp) / "repo"
        shutil.copytree(ROOT, source, ignore=IGNORE)
        if not args.no_baseline:
            every = tuple(dict.fromkeys(t for m in mutations for t in m.tests))
            base = run(None, every, logdir, source)
            print(f"baseline: {base.verdict} in {base.seconds}s: {base.tail}", flush=True)
            if base.verdict != "passed":
                print("the unmutated suite fails; fix that first")
                return 1
        for m in mutations:
            result = run(m, m.tests, logdir, source)
            results.append((m, result))
            by = ", ".join(_short(t) for t in result.failed)
            print(f"{m.name}: {result.verdict} in {result.seconds}s {by}", flush=True)

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"\nResults, commit {commit}, {date}:\n")
    print("| mutation | guard | result | failing tests | s |")
    print("| --- | --- | --- | --- | --- |")
    for m, r in results:
        failing = ", ".join(f"`{_short(t)}`" for t in r.failed)
        print(f"| `{m.name}` | {m.guard} | {r.verdict} | {failing} | {r.seconds} |")
    survived = [m.name for m, r in results if r.verdict != "killed"]
    if survived:
        print(f"\nnot killed: {', '.join(survived)}")
    return 1 if survived else 0


if __name__ == "__main__":
    raise SystemExit(main())
