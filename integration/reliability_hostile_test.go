package integration

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
	"github.com/kscope-dev/kscope/sequence"
	"github.com/kscope-dev/kscope/txn"
)

// hostileHeader marks each hostile record with its index; kscope keeps a
// record's own headers on the dead-letter topic.
const hostileHeader = "t-n"

// hostileRecords are records no producer should send and some will: each
// must be applied or dead-lettered, never crash the runner or hold its
// partition.
func hostileRecords(topic string) (recs []*kgo.Record, kinds []string) {
	add := func(kind string, key []byte, value []byte, headers ...string) {
		// A valid version first: headers are read last-wins, so a
		// hostile version header below overrides it.
		r := &kgo.Record{Topic: topic, Key: key, Value: value, Headers: []kgo.RecordHeader{
			{Key: sequence.DefaultHeader, Value: []byte("1")},
			{Key: hostileHeader, Value: []byte(strconv.Itoa(len(recs)))},
		}}
		for i := 0; i+1 < len(headers); i += 2 {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: headers[i], Value: []byte(headers[i+1])})
		}
		recs = append(recs, r)
		kinds = append(kinds, kind)
	}
	add("empty value", []byte("h-empty"), []byte{})
	add("nil value", []byte("h-nil"), nil)
	add("900 KiB value", []byte("h-large"), []byte(strings.Repeat("v", 900<<10)))
	add("null key", nil, []byte("x"))
	add("empty key", []byte{}, []byte("x"))
	add("non-UTF-8 key", []byte("\xff\xfe\x00k"), []byte("x"))
	add("duplicate headers", []byte("h-dup"), []byte("x"), "message-id", "dup-a", "message-id", "dup-b", "x", "1", "x", "2")
	add("256 KiB header", []byte("h-bighdr"), []byte("x"), "x-big", strings.Repeat("h", 256<<10))
	add("forged attempt count", []byte("h-attempt"), []byte("x"), retrytopic.HeaderAttempt, "99999999999999999999")
	add("negative attempt, unknown class", []byte("h-class"), []byte("x"), retrytopic.HeaderAttempt, "-5", retrytopic.HeaderErrorClass, "nonsense")
	add("10 KiB forged identity", []byte("h-id"), []byte("x"), consumer.HeaderID, strings.Repeat("i", 10<<10))
	add("non-UTF-8 identity", []byte("h-id8"), []byte("x"), consumer.HeaderID, "\xff\xfe")
	add("corrupt due time and stage", []byte("h-due"), []byte("x"), retrytopic.HeaderDue, "garbage", retrytopic.HeaderStage, "x")
	add("due time in the year 9999", []byte("h-due9999"), []byte("x"), retrytopic.HeaderDue, "253402300799999")
	add("corrupt original coordinates", []byte("h-orig"), []byte("x"),
		consumer.HeaderOriginalTopic, "\xff", consumer.HeaderOriginalPartition, "abc", consumer.HeaderOriginalOffset, "-1")
	add("forged parked mark", []byte("h-parked"), []byte("x"), retrytopic.HeaderParked, "1")
	add("forged version-gap headers", []byte("h-gap"), []byte("x"), retrytopic.HeaderVersionExpected, "x", retrytopic.HeaderVersionActual, "-9")
	add("non-numeric version", []byte("h-ver"), []byte("x"), sequence.DefaultHeader, "abc")
	add("version 0", []byte("h-ver0"), []byte("x"), sequence.DefaultHeader, "0")
	add("version past int64", []byte("h-verbig"), []byte("x"), sequence.DefaultHeader, "99999999999999999999")
	return recs, kinds
}

func hostileIndex(r *kgo.Record) int {
	n, err := strconv.Atoi(testenv.Header(r, hostileHeader))
	if err != nil {
		return -1
	}
	return n
}

// TestReliabilityHostileInput runs the hostile records through a DB-scope
// pipeline with version checks and through a Kafka-scope pipeline, each
// record failing twice first so that its headers go through the failure
// routing (in place, then the retry topic in the DB scope). Each
// record is applied (DB) or transformed (Kafka) exactly once, or sent to
// the dead-letter topic, never both and never neither; the runner reaches
// the end of the partition and Run returns nil.
func TestReliabilityHostileInput(t *testing.T) {
	for _, scope := range []string{"DB", "Kafka"} {
		t.Run(scope, func(t *testing.T) {
			start := time.Now()
			k := testenv.KafkaT(t)
			ctx := context.Background()
			const topic, group = "hostile", "g-hostile"
			for _, tp := range []string{topic, topic + ".out"} {
				if err := k.CreateTopic(ctx, tp, 2); err != nil {
					t.Fatal(err)
				}
			}
			recs, kinds := hostileRecords(topic)
			for _, r := range recs {
				if err := k.Produce(ctx, r); err != nil {
					t.Fatalf("producing %q: %v", kinds[hostileIndex(r)], err)
				}
			}
			logs := &logCapture{}
			cfg := consumer.Config{
				Brokers: k.Brokers, Group: group, Topics: []string{topic}, Shards: 4,
				CommitInterval: 50 * time.Millisecond, Logger: logs.logger(),
				Failures: retrytopic.Policy{Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
					InPlaceAttempts: 2, Ladder: []time.Duration{100 * time.Millisecond}},
			}
			// Every record fails twice before it succeeds: once in place,
			// once more to the retry topic, so its forged kscope headers
			// are read by the failure routing.
			var calls sync.Map
			failFirst := func(r *consumer.Record) error {
				c, _ := calls.LoadOrStore(hostileIndex(r.Record), new(atomic.Int32))
				if c.(*atomic.Int32).Add(1) <= 2 {
					return consumer.Retryable(errors.New("a dependency is briefly unavailable"))
				}
				return nil
			}
			applied := map[int]int{}
			var run func(context.Context) error
			var pool *pgxpool.Pool
			if scope == "DB" {
				pool, _ = dbEnv(t)
				r, err := dbscope.New(cfg, dbscope.Options{Pool: pool, Versions: &sequence.Config{}}, dbscope.HandlerFunc(
					func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
						if err := failFirst(r); err != nil {
							return err
						}
						_, err := tx.Exec(ctx, `INSERT INTO effects (message_id, key, seq) VALUES ($1, $2, $3)`,
							consumer.Identity{}.Of(r), fmt.Sprintf("%q", r.Key), hostileIndex(r.Record))
						return err
					}))
				if err != nil {
					t.Fatal(err)
				}
				run = r.Run
			} else {
				r, err := txn.New(cfg, txn.Options{TransactionalID: "hostile-1", CommitInterval: 50 * time.Millisecond}, txn.HandlerFunc(
					func(ctx context.Context, r *consumer.Record, out txn.Emitter) error {
						if err := failFirst(r); err != nil {
							return err
						}
						out.Emit(&kgo.Record{Topic: topic + ".out", Key: r.Key, Value: []byte(strconv.Itoa(hostileIndex(r.Record)))})
						return nil
					}))
				if err != nil {
					t.Fatal(err)
				}
				run = r.Run
			}
			stop := runRunner(t, run)
			testenv.WaitFor(t, 2*time.Minute, "the runner to reach the end of the partitions", func() bool { return k.CaughtUp(ctx, group, topic) })
			if scope == "DB" {
				// Records in the retry topic are not done yet: wait until
				// every record was applied or dead-lettered.
				testenv.WaitFor(t, 2*time.Minute, "every record applied or dead-lettered", func() bool {
					var n int64
					if err := pool.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&n); err != nil {
						return false
					}
					ends, err := k.EndOffsets(ctx, retrytopic.DLTopic(group))
					if err != nil {
						return false
					}
					for _, e := range ends {
						n += e
					}
					return n >= int64(len(recs))
				})
			}
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if scope == "DB" {
				rows, err := pool.Query(ctx, `SELECT seq FROM effects`)
				if err != nil {
					t.Fatal(err)
				}
				for rows.Next() {
					var n int
					if err := rows.Scan(&n); err != nil {
						t.Fatal(err)
					}
					applied[n]++
				}
				rows.Close()
			} else {
				for _, r := range k.ReadAll(t, topic+".out") {
					n, _ := strconv.Atoi(string(r.Value))
					applied[n]++
				}
			}
			dead := map[int]int{}
			for _, r := range k.ReadAll(t, retrytopic.DLTopic(group)) {
				dead[hostileIndex(r)]++
				for _, h := range r.Headers {
					if h.Key == retrytopic.HeaderError && len(h.Value) > retrytopic.MaxErrorLength {
						t.Errorf("a DLT error header of %d bytes", len(h.Value))
					}
				}
			}
			lost, dups := 0, 0
			for i, kind := range kinds {
				switch a, d := applied[i], dead[i]; {
				case a+d == 0:
					lost++
					t.Errorf("%s: neither applied nor dead-lettered", kind)
				case a+d > 1:
					dups += a + d - 1
					t.Errorf("%s: applied %d times, dead-lettered %d times", kind, a, d)
				default:
					outcome := "applied"
					if d == 1 {
						outcome = "dead-lettered"
					}
					t.Logf("%-34s %s", kind, outcome)
				}
			}
			mustNotLeak(t, "the runner's log", logs.String(), strings.Repeat("v", 1000), strings.Repeat("h", 1000))
			addRelRow(relRow{Scope: scope, Fault: fmt.Sprintf("hostile input: %d kinds of malformed records and forged kscope headers", len(kinds)),
				Records: len(recs), Faults: int64(len(recs)), Lost: lost, Dups: dups, Duration: time.Since(start), Passed: !t.Failed()})
		})
	}
}
