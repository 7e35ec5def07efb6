package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

var metricName = regexp.MustCompile(`kscope_[a-z_]+`)

// exported returns the metric families the run's registry holds.
func exported(t *testing.T, res *Result) map[string]bool {
	t.Helper()
	mfs, err := res.Metrics.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, mf := range mfs {
		out[mf.GetName()] = true
	}
	return out
}

// known reports whether a name used in PromQL is an exported family, or a
// histogram's _bucket, _sum or _count series.
func known(fams map[string]bool, name string) bool {
	for _, suf := range []string{"", "_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suf); ok && fams[base] {
			return true
		}
	}
	return false
}

// The example runs; its scrape shows every record's outcome and the drained
// lag; the alert rules and the dashboard use only metrics kscopeprom
// exports, and the alert file is valid rule-file YAML with a for: where the
// issue asks for a sustained condition.
func TestExampleAlertsAndDashboard(t *testing.T) {
	res, err := Run(context.Background(), "127.0.0.1:0", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		fmt.Sprintf(`kscope_records_processed_total{consumer_group=%q,outcome="success",topic=%q} 314`, group, topic),
		fmt.Sprintf(`kscope_outbox_published_records_total{outbox=%q} 20`, topic),
		fmt.Sprintf(`kscope_outbox_pending_rows{outbox=%q,partition="0"} 0`, topic),
		fmt.Sprintf(`kscope_records_processed_total{consumer_group=%q,outcome="dead_lettered",topic=%q} 6`, group, topic),
		fmt.Sprintf(`kscope_handler_retries_total{consumer_group=%q,reason="retryable",topic=%q} 8`, group, topic),
		fmt.Sprintf(`kscope_dead_letters_total{consumer_group=%q,reason="deserialization_failure",topic=%q} 6`, group, topic),
	} {
		if !strings.Contains(res.Scrape, want) {
			t.Errorf("scrape lacks %s:\n%s", want, res.Scrape)
		}
	}
	if want := `200 {"status":"ok","checks":[{"runner":"` + group + `","ok":true}]}`; res.Readyz != want {
		t.Errorf("GET /readyz over HTTP once drained: %s, want %s", res.Readyz, want)
	}
	if res.Spans != records+outboxed+1 {
		t.Errorf("%d spans recorded, want one per delivery (%d) and the outbox writer's", res.Spans, records+outboxed)
	}
	if res.OutboxTraced != outboxed {
		t.Errorf("%d consumer spans continue the outbox writer's trace, want %d", res.OutboxTraced, outboxed)
	}
	// The per-partition series went with the partitions when the run
	// stopped; the scrape, taken while it ran, has them. The run saw no
	// retry-topic hop, so no lateness.
	fams := exported(t, res)
	for _, n := range metricName.FindAllString(res.Scrape, -1) {
		fams[n] = true
	}
	fams["kscope_retry_lateness_seconds"] = true
	// Nor did a handler stall: kscope_stalled_key_shards has a series only
	// once one has (TestStalledKeyShardGauge in kscopeprom).
	fams["kscope_stalled_key_shards"] = true
	// Nor did a key-shard hold on a deployment error: kscope_held_key_shards
	// has a series only once one has (TestHeldKeyShardsGauge in kscopeprom).
	fams["kscope_held_key_shards"] = true
	// Nor did a record repeat one already applied: kscope_duplicates_total
	// has a series only once one has (TestHandbookMetricsThroughARunner and
	// TestKafkaGuardDuplicates in kscopeprom).
	fams["kscope_duplicates_total"] = true
	// Nor did a record find a version gap: kscope_version_gaps_total has a
	// series only once one has (TestVersionGapsMetric in kscopeprom).
	fams["kscope_version_gaps_total"] = true
	// Nor does the example watch a dead-letter topic:
	// kscope_dead_letters_waiting is registered by
	// Metrics.WatchDeadLetters (TestDeadLettersWaitingRiseWithDeadLettersAndFallWithRedrives
	// in cmd/kscope).
	fams["kscope_dead_letters_waiting"] = true
	// Nor does it run a share group: the kscope_share_* metrics are
	// registered by Metrics.WatchShare (TestShareGroupMetrics in
	// kscopeprom).
	fams["kscope_share_deliveries_exhausted_total"] = true

	// The series pipelines.yml records are the user's, read by the alerts.
	type ruleFile struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert  string
				Record string
				Expr   string
				For    string
				Labels map[string]string
			}
		}
	}
	var pipelines ruleFile
	raw, err := os.ReadFile("pipelines.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &pipelines); err != nil {
		t.Fatalf("pipelines.yml: %v", err)
	}
	for _, g := range pipelines.Groups {
		for _, r := range g.Rules {
			if r.Record == "" || r.Labels["consumer_group"] == "" || (r.Record == "kscope_pipeline_info" && r.Labels["critical"] == "") {
				t.Errorf("pipelines.yml: rule %+v does not record a series with consumer_group (and critical, for kscope_pipeline_info)", r)
			}
			fams[r.Record] = true
		}
	}
	raw, err = os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules ruleFile
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	alerts := map[string]string{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				for _, n := range metricName.FindAllString(r.Expr, -1) {
					if !known(fams, n) {
						t.Errorf("recording rule %s uses %s, which kscopeprom does not export and pipelines.yml does not record", r.Record, n)
					}
				}
				continue
			}
			if r.Alert == "" || r.Expr == "" || r.Labels["severity"] == "" {
				t.Errorf("rule %+v lacks an alert name, an expr or a severity", r)
			}
			alerts[r.Alert] = r.For
			for _, n := range metricName.FindAllString(r.Expr, -1) {
				if !known(fams, n) {
					t.Errorf("alert %s uses %s, which kscopeprom does not export and pipelines.yml does not record", r.Alert, n)
				}
			}
		}
	}
	// Every alert has a promtool unit test.
	tested := map[string]bool{}
	for _, f := range []string{"alerts_test.yml", "pipelines_test.yml"} {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var unit struct {
			Tests []struct {
				AlertRuleTest []struct {
					Alertname string `yaml:"alertname"`
				} `yaml:"alert_rule_test"`
			}
		}
		if err := yaml.Unmarshal(raw, &unit); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, tc := range unit.Tests {
			for _, a := range tc.AlertRuleTest {
				tested[a.Alertname] = true
			}
		}
	}
	for a := range alerts {
		if !tested[a] {
			t.Errorf("alert %s has no unit test in alerts_test.yml or pipelines_test.yml", a)
		}
	}
	for _, a := range []string{"KscopeConsumerLagHigh", "KscopeHandlerStalled", "KscopeDeadLetterOnCriticalPipeline", "KscopeRetryExhaustion", "KscopeOffsetCommitsFailing",
		"KscopePipelineDown", "KscopeConsumerGone",
		"KscopeOutboxPendingGrowing", "KscopeOutboxStalled", "KscopeOutboxDeadLettered", "KscopeOutboxBlocked"} {
		if _, ok := alerts[a]; !ok {
			t.Errorf("alerts.yml lacks %s", a)
		}
	}
	if alerts["KscopeConsumerLagHigh"] == "" {
		t.Error("the lag alert has no for: (it must be sustained)")
	}

	raw, err = os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	if len(dash.Panels) == 0 {
		t.Fatal("dashboard.json has no panels")
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, n := range metricName.FindAllString(tg.Expr, -1) {
				if !known(fams, n) {
					t.Errorf("panel %q uses %s, which kscopeprom does not export", p.Title, n)
				}
			}
		}
	}
}

// promtool, Prometheus's own checker, takes what kscope exports and ships:
// the scrape passes its metric lint, the rule files load, and the rule
// unit tests of alerts_test.yml and pipelines_test.yml pass (each alert fires on the series it is
// for, and not before its for: has passed).
func TestPromtoolChecksTheScrapeAndTheRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not installed (Debian: apt-get install prometheus); .ci/run installs it")
	}
	res, err := Run(context.Background(), "127.0.0.1:0", 0)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(res.Metrics.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	scrape, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !bytes.Contains(scrape, []byte("kscope_records_processed_total")) {
		t.Fatalf("scrape of the metrics handler: %v\n%s", err, scrape)
	}
	lint := exec.Command(promtool, "check", "metrics")
	lint.Stdin = bytes.NewReader(scrape)
	if out, err := lint.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics on the scrape: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"check", "rules", "alerts.yml", "pipelines.yml"}, {"test", "rules", "alerts_test.yml", "pipelines_test.yml"}} {
		if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
