package main

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/google/pprof/profile"
)

// owners attribute CPU samples to the code responsible for them: the first
// frame from the leaf up that belongs to one of these, so that allocation
// and scheduling in the runtime count against the code that caused them.
// kmsg and kbin (the protocol codecs) are shared by the client and the
// in-process broker: a sample in them belongs to whichever called them.
var owners = []struct{ prefix, name string }{
	{"github.com/twmb/franz-go/pkg/kfake", "kfake broker (in-process)"},
	{"github.com/twmb/franz-go/pkg/kgo", "franz-go client"},
	{"github.com/kscope-dev/kscope/", "kscope"},
	{"github.com/jackc/", "pgx"},
	{"github.com/IBM/sarama", "sarama"},
	{"github.com/ThreeDotsLabs/", "watermill"},
	{"main.", "benchmark harness"},
}

// profileRun runs c once under the CPU profiler and summarizes where the
// time went.
func (b *bench) profileRun(ctx context.Context, c contender) (string, error) {
	var buf bytes.Buffer
	if err := pprof.StartCPUProfile(&buf); err != nil {
		return "", err
	}
	res, err := b.timed(ctx, c, c.n)
	pprof.StopCPUProfile()
	if err != nil {
		return "", err
	}
	if dir := os.Getenv("KSCOPE_BENCH_PROFILE_DIR"); dir != "" {
		// The raw profile, for go tool pprof.
		name := filepath.Join(dir, strings.NewReplacer(" ", "_", "/", "_", ",", "", ":", "").Replace(c.name)+".pprof")
		if err := os.WriteFile(name, buf.Bytes(), 0o644); err != nil {
			return "", err
		}
	}
	p, err := profile.Parse(&buf)
	if err != nil {
		return "", err
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "Profiled run of %q: %d records in %s (%.0f records/s); bench process CPU %s",
		c.name, res.records, res.elapsed.Round(time.Millisecond), res.rate(), res.benchCPU.Round(time.Millisecond))
	if res.pgCPU > 0 {
		fmt.Fprintf(&sb, ", PostgreSQL CPU %s", res.pgCPU.Round(time.Millisecond))
	}
	sb.WriteString(".\n\n")
	sb.WriteString(summarize(p))
	return sb.String(), nil
}

func funcName(l *profile.Location, i int) string {
	if i < len(l.Line) && l.Line[i].Function != nil {
		return l.Line[i].Function.Name
	}
	return ""
}

// summarize renders the share of CPU by owner, the top functions by own
// time, and kscope's functions by cumulative time.
func summarize(p *profile.Profile) string {
	vi := len(p.SampleType) - 1 // cpu nanoseconds
	var total int64
	byOwner := map[string]int64{}
	flat := map[string]int64{}
	cum := map[string]int64{}
	for _, s := range p.Sample {
		v := s.Value[vi]
		total += v
		var frames []string
		for _, l := range s.Location {
			for i := range l.Line {
				frames = append(frames, funcName(l, i))
			}
		}
		if len(frames) > 0 {
			flat[frames[0]] += v
		}
		owner := "Go runtime, standard library"
		if slices.ContainsFunc(frames, func(f string) bool { return strings.HasPrefix(f, "runtime.gcBgMarkWorker") }) {
			owner = "garbage collector (background)"
		} else {
		find:
			for _, f := range frames {
				for _, o := range owners {
					if strings.HasPrefix(f, o.prefix) {
						owner = o.name
						break find
					}
				}
			}
		}
		byOwner[owner] += v
		seen := map[string]bool{}
		for _, f := range frames {
			if strings.HasPrefix(f, "github.com/kscope-dev/kscope/") && !seen[f] {
				seen[f] = true
				cum[f] += v
			}
		}
	}
	if total == 0 {
		return "No CPU samples were taken.\n"
	}
	pct := func(v int64) float64 { return 100 * float64(v) / float64(total) }
	var sb strings.Builder
	fmt.Fprintf(&sb, "CPU samples: %s. Share by owner (the first frame from the leaf up in that code):\n\n",
		time.Duration(total).Round(time.Millisecond))
	sb.WriteString("| owner | share |\n| --- | ---: |\n")
	for _, e := range top(byOwner, 20) {
		fmt.Fprintf(&sb, "| %s | %.1f%% |\n", e.k, pct(e.v))
	}
	sb.WriteString("\nTop functions by own time:\n\n| function | flat |\n| --- | ---: |\n")
	for _, e := range top(flat, 12) {
		fmt.Fprintf(&sb, "| `%s` | %.1f%% |\n", e.k, pct(e.v))
	}
	sb.WriteString("\nkscope's functions by cumulative time:\n\n| function | cum |\n| --- | ---: |\n")
	for _, e := range top(cum, 10) {
		fmt.Fprintf(&sb, "| `%s` | %.1f%% |\n", e.k, pct(e.v))
	}
	return sb.String()
}

type kv struct {
	k string
	v int64
}

func top(m map[string]int64, n int) []kv {
	out := make([]kv, 0, len(m))
	for k, v := range m {
		out = append(out, kv{k, v})
	}
	slices.SortFunc(out, func(a, b kv) int {
		if c := cmp.Compare(b.v, a.v); c != 0 {
			return c
		}
		return strings.Compare(a.k, b.k)
	})
	return out[:min(n, len(out))]
}
