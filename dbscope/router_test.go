package dbscope_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// A DB-scope router, as a Handler and as a QueueHandler, routes by topic,
// by header value and by pattern (a topic created after the start), each
// in the record's transaction; a record no route takes is dead-lettered
// and writes nothing.
func TestRouterInTheDBScope(t *testing.T) {
	for _, queued := range []bool{false, true} {
		name := map[bool]string{false: "Handler", true: "QueueHandler"}[queued]
		t.Run(name, func(t *testing.T) { testDBRouter(t, queued) })
	}
}

func testDBRouter(t *testing.T, queued bool) {
	k := testenv.KafkaT(t)
	pool := newPool(t)
	ctx := context.Background()
	for _, topic := range []string{"orders", "payments"} {
		if err := k.CreateTopic(ctx, topic, 2); err != nil {
			t.Fatal(err)
		}
	}
	// Each route writes its name as the effect's key.
	insert := func(route string) (dbscope.Handler, dbscope.QueueHandler) {
		return dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
				_, err := tx.Exec(ctx, `INSERT INTO effects (message_id, key) VALUES ($1, $2)`, string(r.Value), route)
				return err
			}), dbscope.QueueFunc(func(_ context.Context, q *dbscope.Queue, r *consumer.Record) error {
				q.Exec(`INSERT INTO effects (message_id, key) VALUES ($1, $2)`, string(r.Value), route)
				return nil
			})
	}
	hr, qr := dbscope.NewRouter(), dbscope.NewQueueRouter()
	for _, rt := range []struct{ topic, value, pattern, name string }{
		{topic: "orders", name: "orders"},
		{topic: "payments", value: "refund", name: "refunds"},
		{pattern: `^events\.`, name: "events"},
	} {
		h, q := insert(rt.name)
		switch {
		case rt.pattern != "":
			hr.Pattern(rt.pattern, h)
			qr.Pattern(rt.pattern, q)
		case rt.value != "":
			hr.Header(rt.topic, "event-type", rt.value, h)
			qr.Header(rt.topic, "event-type", rt.value, q)
		default:
			hr.Topic(rt.topic, h)
			qr.Topic(rt.topic, q)
		}
	}
	cfg := baseConfig(k, "g-db-route", "orders")
	cfg.Topics = []string{"orders", "payments"}
	cfg.TopicPatterns = []string{`^events\.`}
	cfg.ClientOptions = []kgo.Opt{kgo.MetadataMinAge(50 * time.Millisecond), kgo.MetadataMaxAge(200 * time.Millisecond)}
	r := newEither(t, cfg, dbscope.Options{Pool: pool}, hr, map[bool]dbscope.QueueHandler{true: qr}[queued])
	stop := run(t, r)
	produceAll(t, k, rec("orders", "o1"), rec("payments", "p1", "event-type", "refund"), rec("payments", "p2", "event-type", "charge"))
	testenv.WaitFor(t, time.Minute, "two effects and one dead letter", func() bool {
		return countEffects(t, pool).rows == 2 && r.Stats().Failures.DeadLettered == 1
	})
	if err := k.CreateTopic(ctx, "events.new", 1); err != nil {
		t.Fatal(err)
	}
	produceAll(t, k, rec("events.new", "e1"))
	testenv.WaitFor(t, time.Minute, "the new topic's record applied", func() bool { return countEffects(t, pool).rows == 3 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	got := effectColumn(t, pool, "message_id || ':' || key")
	slices.Sort(got)
	if want := []string{"e1:events", "o1:orders", "p1:refunds"}; !slices.Equal(got, want) {
		t.Errorf("effects %v; want %v", got, want)
	}
	dlt := k.ReadAll(t, retrytopic.DLTopic("g-db-route"))
	if len(dlt) != 1 || string(dlt[0].Value) != "p2" || !strings.Contains(testenv.Header(dlt[0], retrytopic.HeaderError), `event-type="charge"`) {
		t.Errorf("dead letters %v; want p2, its error naming its header", dlt)
	}
}

// dbscope.New and NewQueued refuse a router that cannot route a topic of
// Config.Topics, naming the topic.
func TestRouterUnroutedTopicFailsDBScopeConstruction(t *testing.T) {
	k := testenv.KafkaT(t)
	cfg := baseConfig(k, "g-db-unrouted", "orders")
	cfg.Topics = []string{"orders", "shipments"}
	_, err := dbscope.New(cfg, dbscope.Options{Pool: newPool(t)}, dbscope.NewRouter().Topic("orders", dbscope.HandlerFunc(insertEffect)))
	if err == nil || !strings.Contains(err.Error(), `kscope: Config.Topics: lists "shipments", which the handler (a dbscope.Router) has no route for`) {
		t.Errorf("dbscope.New = %v", err)
	}
	q := dbscope.QueueFunc(func(context.Context, *dbscope.Queue, *consumer.Record) error { return nil })
	_, err = dbscope.NewQueued(cfg, dbscope.Options{Pool: newPool(t)}, dbscope.NewQueueRouter().Topic("orders", q))
	if err == nil || !strings.Contains(err.Error(), `"shipments", which the handler (a dbscope.QueueRouter) has no route`) {
		t.Errorf("dbscope.NewQueued = %v", err)
	}
}

func rec(topic, value string, headers ...string) *kgo.Record {
	r := &kgo.Record{Topic: topic, Key: []byte(value), Value: []byte(value)}
	for i := 0; i+1 < len(headers); i += 2 {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: headers[i], Value: []byte(headers[i+1])})
	}
	return r
}

func produceAll(t *testing.T, k *testenv.Kafka, recs ...*kgo.Record) {
	t.Helper()
	if err := k.Produce(context.Background(), recs...); err != nil {
		t.Fatal(err)
	}
}
