package integration

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/internal/testenv"
)

// Kubernetes stops a pod with SIGTERM. The quickstart, built as a user
// builds it and run as a service (-topic), gets SIGTERM while records
// flow in: it drains, commits and exits 0, and the group's committed
// offsets on the broker stand, partition by partition, at the lowest
// offset it did not handle, so nothing it handled is handed out again.
func TestQuickstartDrainsAndCommitsOnSIGTERM(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "quickstart")
	build := exec.Command(goBin(), "build", "-o", bin, "./examples/quickstart")
	build.Dir = ".."
	build.Env = goEnv()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./examples/quickstart: %v\n%s", err, out)
	}

	k := testenv.KafkaT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	topic, group := "sigterm.orders", "sigterm-quickstart"
	if err := k.CreateTopic(ctx, topic, 3); err != nil {
		t.Fatal(err)
	}

	// Records keep arriving until the child has exited.
	stopProducing := make(chan struct{})
	var produced sync.WaitGroup
	produced.Add(1)
	go func() {
		defer produced.Done()
		for i := 0; ; i += 20 {
			select {
			case <-stopProducing:
				return
			default:
			}
			var recs []*kgo.Record
			for j := i; j < i+20; j++ {
				recs = append(recs, &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", j%10), Value: fmt.Appendf(nil, "order %d", j)})
			}
			if err := k.Produce(ctx, recs...); err != nil && ctx.Err() == nil {
				t.Errorf("producing: %v", err)
				return
			}
		}
	}()
	defer func() { close(stopProducing); produced.Wait() }()

	cmd := exec.Command(bin, "-topic", topic, "-group", group)
	cmd.Env = append(goEnv(), "KAFKA_BROKERS="+k.Brokers[0])
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr testenv.LogBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		handled = map[int32]map[int64]bool{}
		count   int
		last    string
	)
	enough := make(chan struct{})
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var p int32
			var o int64
			mu.Lock()
			last = sc.Text()
			if n, _ := fmt.Sscanf(sc.Text(), "partition %d offset %d", &p, &o); n == 2 {
				if handled[p] == nil {
					handled[p] = map[int64]bool{}
				}
				handled[p][o] = true
				if count++; count == 200 {
					close(enough)
				}
			}
			mu.Unlock()
		}
	}()
	exited := make(chan error, 1)
	go func() { <-read; exited <- cmd.Wait() }()

	select {
	case <-enough:
	case err := <-exited:
		t.Fatalf("the quickstart exited before it handled 200 records: %v\n%s", err, stderr.String())
	case <-ctx.Done():
		cmd.Process.Kill()
		t.Fatalf("the quickstart handled %d records in 2 minutes\n%s", count, stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("after SIGTERM the quickstart exited with %v, want status 0\n%s", err, stderr.String())
		} else if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("the quickstart did not exit within 30s of SIGTERM\n%s", stderr.String())
	}
	mu.Lock()
	defer mu.Unlock()
	if want := fmt.Sprintf("stopped: handled %d records, committed their offsets", count); last != want {
		t.Errorf("last line %q, want %q", last, want)
	}

	committed, err := k.CommittedOffsets(ctx, group, topic)
	if err != nil {
		t.Fatal(err)
	}
	for p := int32(0); p < 3; p++ {
		want := int64(0)
		for handled[p][want] {
			want++
		}
		if got := committed[p]; got != want {
			t.Errorf("partition %d: committed offset %d, want %d: the lowest offset the quickstart did not handle (it handled %d of the partition's records)",
				p, got, want, len(handled[p]))
		}
	}
	t.Logf("handled %d records before and during the drain; committed %v", count, committed)
}
