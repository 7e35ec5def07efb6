package health_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/health"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/sequence"
	"github.com/kscope-dev/kscope/txn"
)

// A Kafka-scope runner with Versions is not ready once its member joined
// the group until the versions of its assigned partitions are restored
// from their changelogs. The restore reads a changelog up to its last
// stable offset, so a transaction left open on the changelog holds it
// back (on kfake and on Apache Kafka alike): /readyz answers 503 naming
// the restore and /livez 200 until the transaction is aborted, then
// /readyz answers 200.
func TestReadyzWaitsForTheChangelogRestore(t *testing.T) {
	k := testenv.KafkaT(t)
	ctx := context.Background()
	const topic, group = "health-restore", "g-health-restore"
	changelog := txn.VersionsTopic(group, topic)
	for _, name := range []string{topic, changelog} {
		if err := k.CreateTopic(ctx, name, 2); err != nil {
			t.Fatal(err)
		}
	}
	open, err := k.Client(kgo.TransactionalID("health-restore-holder"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if err := open.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := open.ProduceSync(ctx, &kgo.Record{Topic: changelog, Partition: 1, Key: []byte("held")}).FirstErr(); err != nil {
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
		return code == http.StatusServiceUnavailable && r.Health().Joined && says(rep, group, "being restored from their changelogs")
	})
	t.Logf("%s: joined, restore held back: %+v", k.Kind, rep)
	if code, rep := probe(t, srv, "/livez"); code != http.StatusOK {
		t.Fatalf("/livez %d %+v while the changelog is restored, want 200", code, rep)
	}

	if err := open.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	lifted := time.Now()
	testenv.WaitFor(t, 30*time.Second, "/readyz 200 once the changelog is restored", func() bool {
		code, _ := probe(t, srv, "/readyz")
		return code == http.StatusOK
	})
	t.Logf("%s: ready %s after the transaction holding the restore back ended", k.Kind, time.Since(lifted).Round(time.Millisecond))
	if w := r.Stats().Waiting; w != "" {
		t.Fatalf("ready with Stats().Waiting %q", w)
	}
}

// A restore that fails is retried, and /readyz names its last failure
// meanwhile (here the broker refuses to list the changelog's offsets).
func TestReadyzNamesAFailedRestore(t *testing.T) {
	k := testenv.KafkaT(t)
	if k.Cluster == nil {
		t.Skip("refusing the changelog needs the in-process kfake backend")
	}
	const topic, group = "health-restore-refused", "g-health-restore-refused"
	if err := k.CreateTopic(context.Background(), topic, 1); err != nil {
		t.Fatal(err)
	}
	refuse, err := k.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.ListOffsets}, Topic: txn.VersionsTopic(group, topic),
		Err: kerr.TopicAuthorizationFailed, Count: -1})
	if err != nil {
		t.Fatal(err)
	}
	r, err := txn.New(config(k, group, topic), txn.Options{TransactionalID: "health-restore-refused", Versions: &sequence.Config{}},
		txn.HandlerFunc(func(context.Context, *consumer.Record, txn.Emitter) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(health.New(r))
	defer srv.Close()
	run(t, r)
	testenv.WaitFor(t, 30*time.Second, "/readyz 503 naming the restore's last failure", func() bool {
		code, rep := probe(t, srv, "/readyz")
		return code == http.StatusServiceUnavailable && says(rep, group, "being restored") && says(rep, group, "TOPIC_AUTHORIZATION_FAILED")
	})
	refuse.Remove()
	testenv.WaitFor(t, 30*time.Second, "/readyz 200 once the restore went through", func() bool {
		code, _ := probe(t, srv, "/readyz")
		return code == http.StatusOK
	})
}
