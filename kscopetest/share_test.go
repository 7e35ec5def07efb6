package kscopetest_test

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/kscopetest"
)

// A DB-scope pipeline run as a share-group member holds every row of the
// share-group table: duplicates, a lock that expired, poison, a runner
// stopped mid-transaction and a replay each leave one effect per record,
// and no record's handler runs again but those the scenario redelivers.
func TestKitDBShare(t *testing.T) {
	rep := kscopetest.DBShare(t, ordersPipeline())
	if !rep.Held() {
		t.Fatalf("report %+v", rep)
	}
	want := map[string]bool{
		"share_success_then_accept": true, "share_duplicate_delivery_skipped": true, "share_redelivery_after_lock_expiry": true,
		"share_poison_to_dlt_with_delivery_count": true, "share_crash_mid_transaction": true, "share_replay_no_new_effects": true,
	}
	for _, r := range rep {
		if !want[r.Scenario] || !r.Held {
			t.Errorf("%s: held %v, skipped %v (%s)", r.Scenario, r.Held, r.Skipped, r.Detail)
		}
		delete(want, r.Scenario)
	}
	if len(want) > 0 {
		t.Fatalf("scenarios not run: %v", want)
	}
}

// A handler that writes its effect outside the DB scope's transaction (on
// a connection of its own) is not exactly-once in a share group: the crash
// row, whose record is delivered again after its handler ran, fails and
// counts the effects; the success row passes.
func TestKitDBShareReportsAnEffectOutsideTheTransaction(t *testing.T) {
	switch os.Getenv(leaveEnv) {
	case "outside":
		p := ordersPipeline()
		p.Handler = dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			conn, err := pgx.Connect(ctx, tx.Conn().Config().ConnString())
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(ctx))
			_, err = conn.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, string(r.Value))
			return err
		})
		kscopetest.DBShare(t, p)
		return
	case "":
	default:
		return
	}
	cmd := exec.Command(os.Args[0], "-test.count=1", "-test.v",
		"-test.run=^TestKitDBShareReportsAnEffectOutsideTheTransaction$/^(share_success_then_accept|share_crash_mid_transaction)$")
	cmd.Env = append(os.Environ(), leaveEnv+"=outside")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the kit passed a handler whose effect escapes the transaction:\n%s", out)
	}
	for _, want := range []string{
		`(?s)[0-9]+ effects for 6 records, one of them left mid-transaction.*--- FAIL: TestKitDBShareReportsAnEffectOutsideTheTransaction/share_crash_mid_transaction\b`,
		`--- PASS: TestKitDBShareReportsAnEffectOutsideTheTransaction/share_success_then_accept\b`,
	} {
		if !regexp.MustCompile(want).Match(out) {
			t.Errorf("child output does not match %q:\n%s", want, out)
		}
	}
}
