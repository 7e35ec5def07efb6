package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/intent"
	"github.com/kscope-dev/kscope/internal/testenv"
)

const gatewayEnv = "KSCOPE_CHILD_GATEWAY"

// chargeGateway is a payment gateway that does not deduplicate (every
// POST charges) and answers lookups by idempotency key.
type chargeGateway struct {
	url string
	srv *http.Server

	mu         sync.Mutex
	charges    map[string]int
	reconciled int
}

func startChargeGateway(t *testing.T) *chargeGateway {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &chargeGateway{url: "http://" + ln.Addr().String(), charges: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		g.charges[r.Header.Get("Idempotency-Key")]++
		g.mu.Unlock()
		io.WriteString(w, "captured") //nolint:errcheck
	})
	mux.HandleFunc("GET /charges/{key}", func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.charges[r.PathValue("key")] == 0 {
			http.Error(w, "no such charge", http.StatusNotFound)
			return
		}
		g.reconciled++
		io.WriteString(w, "captured") //nolint:errcheck
	})
	g.srv = &http.Server{Handler: mux}
	go g.srv.Serve(ln) //nolint:errcheck // ends with Close
	t.Cleanup(func() { g.srv.Close() })
	return g
}

// runIntentChild consumes in the DB scope; each record charges the gateway
// through an intent keyed by the record's identity, writes its effect and
// then dawdles, so that a kill often lands between the call and the
// commit.
func runIntentChild(ctx context.Context, cfg consumer.Config, maxDelay time.Duration, emit func([]byte)) int {
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pool.Close()
	gw := os.Getenv(gatewayEnv)
	hc := &http.Client{Timeout: 5 * time.Second}
	send := func(req *http.Request) ([]byte, int, error) {
		resp, err := hc.Do(req)
		if err != nil {
			return nil, 0, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return b, resp.StatusCode, err
	}
	call := func(ctx context.Context, key string) ([]byte, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gw+"/charges", bytes.NewReader(nil))
		req.Header.Set("Idempotency-Key", key)
		b, code, err := send(req)
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("gateway: %d", code)
		}
		return b, err
	}
	lookup := func(ctx context.Context, key string) ([]byte, bool, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, gw+"/charges/"+url.PathEscape(key), nil)
		b, code, err := send(req)
		switch {
		case err != nil:
			return nil, false, err
		case code == http.StatusNotFound:
			return nil, false, nil
		case code != http.StatusOK:
			return nil, false, fmt.Errorf("gateway: %d", code)
		}
		return b, true, nil
	}
	intents := intent.New(nil, "") // its own pool: the handler's transaction holds one of the scope's
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			id := consumer.Identity{}.Of(r)
			if _, _, err := intents.Do(ctx, tx, id, call, lookup); err != nil {
				return consumer.Retryable(err)
			}
			key, seq, _ := testenv.ParseKeyed(r.Value)
			if _, err := tx.Exec(ctx, `INSERT INTO effects (message_id, key, seq) VALUES ($1, $2, $3)`, id, key, seq); err != nil {
				return err
			}
			if maxDelay > 0 {
				time.Sleep(rand.N(maxDelay)) // between the call and the commit
			}
			emit(r.Value)
			return nil
		}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := r.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// Intents of external calls under SIGKILL: DB-scope children charge a
// gateway that does not deduplicate, once per record, and are killed at
// random moments, many of them between a charge and the commit of the
// transaction that books it. Every record is booked once and charged
// once: a redelivery whose intent a crash left in flight asks the gateway
// (by idempotency key) instead of charging again, and one whose charge
// never left charges.
func TestReliabilityIntentsUnderKills(t *testing.T) {
	ctx := context.Background()
	start := time.Now()
	n, kills := 200, 4
	if reliabilityLong() {
		n, kills = 600, 12
	}
	k := testenv.KafkaT(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	pool, dbURL := dbEnv(t)
	gw := startChargeGateway(t)
	const topic, group = "charges", "g-rel-intents"
	if err := k.CreateTopic(ctx, topic, 4); err != nil {
		t.Fatal(err)
	}
	recs := make([]*kgo.Record, n)
	for i := range recs {
		v := fmt.Sprintf("k%03d/%d", i%50, i/50)
		recs[i] = &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%03d", i%50)), Value: []byte(v),
			Headers: []kgo.RecordHeader{{Key: consumer.DefaultMessageIDHeader, Value: []byte(v)}}}
	}
	if err := k.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	env := []string{dbURL, gatewayEnv + "=" + gw.url}
	applied := func() int {
		var c int
		if err := pool.QueryRow(ctx, `SELECT count(DISTINCT message_id) FROM effects`).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 24))
	for i := range kills {
		c := startChild(t, k, "db-intent", group, topic, 20*time.Millisecond, func([]byte) {}, env...)
		target := min(n, applied()+n/(2*kills))
		testenv.WaitFor(t, 2*time.Minute, fmt.Sprintf("progress before kill %d", i+1), func() bool { return applied() >= target })
		time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond) // a random moment, not a synchronisation
		c.kill()
	}
	last := startChild(t, k, "db-intent", group, topic, 0, func([]byte) {}, env...)
	testenv.WaitFor(t, 3*time.Minute, "every record booked", func() bool { return applied() == n })
	if err := last.terminate(t); err != nil {
		t.Fatalf("the last member exited with %v", err)
	}

	var rows, ids int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id) FROM effects`).Scan(&rows, &ids); err != nil {
		t.Fatal(err)
	}
	gw.mu.Lock()
	charged, doubled, missing := 0, 0, 0
	for _, r := range recs {
		switch c := gw.charges[string(r.Value)]; {
		case c == 0:
			missing++
		case c > 1:
			doubled += c - 1
		}
		if gw.charges[string(r.Value)] > 0 {
			charged++
		}
	}
	reconciled := gw.reconciled
	gw.mu.Unlock()
	t.Logf("%d records, %d kills: %d booked (%d rows), %d charged, %d charged twice, %d not charged, %d reconciled after a crash",
		n, kills, ids, rows, charged, doubled, missing, reconciled)
	addRelRow(relRow{Scope: "DB", Records: n, Kills: int64(kills), Faults: int64(kills),
		Fault: fmt.Sprintf("intents of external calls: SIGKILLs between a gateway charge and its commit (%d reconciled instead of charged again)", reconciled),
		Lost:  max(n-ids, missing), Dups: rows - ids + doubled, Duration: time.Since(start),
		Passed: rows == n && ids == n && doubled == 0 && missing == 0})
	if rows != n || ids != n {
		t.Errorf("%d bookings of %d records, want %d", rows, ids, n)
	}
	if doubled != 0 || missing != 0 {
		t.Errorf("%d double charges and %d records never charged, want none", doubled, missing)
	}
	if reliabilityLong() && reconciled == 0 {
		t.Error("no kill landed between a charge and its commit: the scenario did not test reconcile")
	}
}
