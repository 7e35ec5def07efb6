package kscopetest_test

import (
	"os"
	"os/exec"
	"regexp"
	"testing"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/kscopetest"
	"github.com/kscope-dev/kscope/sequence"
)

// A scenario that does not apply to the pipeline is skipped, with the
// reason, not reported as passing: the undecodable record without
// Undecodable, out-of-order versions without Versions, and with a version
// extractor (the kit writes versions in a header only).
func TestKitSkipsWhatDoesNotApply(t *testing.T) {
	if os.Getenv(leaveEnv) == "skips" {
		p := ordersPipeline()
		p.Undecodable = nil
		t.Run("unversioned", func(t *testing.T) { kscopetest.DB(t, p) })
		p.Options.Versions = &sequence.Config{Extract: func(*consumer.Record) (int64, error) { return 1, nil }}
		t.Run("extractor", func(t *testing.T) { kscopetest.DB(t, p) })
		return
	}
	if os.Getenv(leaveEnv) != "" {
		return
	}
	cmd := exec.Command(os.Args[0], "-test.count=1", "-test.v",
		"-test.run=^TestKitSkipsWhatDoesNotApply$/^(unversioned|extractor)$/^(undecodable_record_to_dlt|out_of_order_versions)$")
	cmd.Env = append(os.Environ(), leaveEnv+"=skips")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	for _, want := range []string{
		`(?s)not applicable: the pipeline has no Undecodable.*--- SKIP: TestKitSkipsWhatDoesNotApply/unversioned/undecodable_record_to_dlt`,
		`(?s)not applicable: the pipeline has no Options.Versions.*--- SKIP: TestKitSkipsWhatDoesNotApply/unversioned/out_of_order_versions`,
		`(?s)not applicable: Options.Versions.Extract reads the versions.*--- SKIP: TestKitSkipsWhatDoesNotApply/extractor/out_of_order_versions`,
		`(?s)--- SKIP: TestKitSkipsWhatDoesNotApply/extractor/undecodable_record_to_dlt`,
	} {
		if !regexp.MustCompile(want).Match(out) {
			t.Errorf("child output does not match %q:\n%s", want, out)
		}
	}
	if regexp.MustCompile(`--- PASS: TestKitSkipsWhatDoesNotApply/\w+/\w+`).Match(out) {
		t.Errorf("a scenario that does not apply passed:\n%s", out)
	}
}
