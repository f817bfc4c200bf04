# Reconciles the test runner's counts with the records tests wrote to $VM_TEST_SKIP_LOG
# (see test-support/src/lib.rs). Used by ci/test.sh:
#
#   awk -v passed=P -v failed=F -f ci/count-tests.awk "$VM_TEST_SKIP_LOG"
#
# P and F are what nextest (or libtest) counted: one pass or failure per test. The log holds
#   SKIP <test>: <reason>                   a whole test skipped: libtest reported it as a
#                                           pass, so it is taken off `passed`
#   SKIP <test> [<unit>]: <reason>          one skipped unit (a driver) of a per-driver test
#   UNITS <test>: P passed, F failed, S skipped
#                                           a per-driver test's own count, which replaces the
#                                           one pass (F = 0) or failure (F > 0) libtest saw
# A retried test writes its lines again: the last line of each unit wins, so a retry is never
# counted twice. Prints the skip lines kept (in first-seen order), then one line
# `COUNTS <passed> <failed> <skipped>`.

function unit_of(line,    s) {
    s = line
    sub(/^(SKIP|UNITS) /, "", s)
    sub(/: .*$/, "", s)
    return s
}

/^SKIP / {
    id = unit_of($0)
    if (!(id in skip_line)) skip_order[++n_skips] = id
    skip_line[id] = $0
    next
}

/^UNITS / {
    id = unit_of($0)
    if (match($0, /: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$/)) {
        split(substr($0, RSTART + 2), f, /[^0-9]+/)
        units_passed[id] = f[1]
        units_failed[id] = f[2]
    }
    next
}

END {
    skipped = 0
    for (i = 1; i <= n_skips; i++) {
        id = skip_order[i]
        print skip_line[id]
        skipped++
        # A whole-test skip (no "[unit]"): libtest counted that test as passed.
        if (id !~ /\]$/) passed--
    }
    for (id in units_passed) {
        if (units_failed[id] == 0) {
            passed += units_passed[id] - 1
        } else {
            passed += units_passed[id]
            failed += units_failed[id] - 1
        }
    }
    printf "COUNTS %d %d %d\n", passed, failed, skipped
}
