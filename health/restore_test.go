package health_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/health"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/sequence"
	"github.com/kscope-dev/kscope/txn"
)

// A Kafka-scope runner with Versions is not ready once its member joined
// the group until the versions of its assigned partitions are restored
// from their changelogs: while the restore is held back (the broker
// refuses to list the changelog's offsets), /readyz answers 503 naming
// the restore and its last failure and /livez 200; once the broker lets
// the restore through, /readyz answers 200.
func TestReadyzWaitsForTheChangelogRestore(t *testing.T) {
	k := testenv.KafkaT(t)
	if k.Cluster == nil {
		t.Skip("holding the restore back needs the in-process kfake backend")
	}
	const topic, group = "health-restore", "g-health-restore"
	if err := k.CreateTopic(context.Background(), topic, 2); err != nil {
		t.Fatal(err)
	}
	refuse, err := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.ListOffsets}, Topic: txn.VersionsTopic(group, topic),
		Err: kerr.TopicAuthorizationFailed, Count: -1})
	if err != nil {
		t.Fatal(err)
	}
	r, err := txn.New(config(k, group, topic), txn.Options{TransactionalID: "health-restore", Versions: &sequence.Config{}},
		txn.HandlerFunc(func(context.Context, *consumer.Record, txn.Emitter) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(health.New(r))
	defer srv.Close()
	run(t, r)

	var rep health.Report
	testenv.WaitFor(t, 30*time.Second, "/readyz 503 naming the held-back restore once the member joined", func() bool {
		var code int
		code, rep = probe(t, srv, "/readyz")
		return code == http.StatusServiceUnavailable && r.Health().Joined &&
			says(rep, group, "being restored from their changelogs") && says(rep, group, "TOPIC_AUTHORIZATION_FAILED")
	})
	t.Logf("joined, restore held back: %+v", rep)
	if code, rep := probe(t, srv, "/livez"); code != http.StatusOK {
		t.Fatalf("/livez %d %+v while the changelog is restored, want 200", code, rep)
	}

	refuse.Remove()
	lifted := time.Now()
	testenv.WaitFor(t, 30*time.Second, "/readyz 200 once the changelog is restored", func() bool {
		code, _ := probe(t, srv, "/readyz")
		return code == http.StatusOK
	})
	t.Logf("ready %s after the restore was let through", time.Since(lifted).Round(time.Millisecond))
	if w := r.Stats().Waiting; w != "" {
		t.Fatalf("ready with Stats().Waiting %q", w)
	}
}
