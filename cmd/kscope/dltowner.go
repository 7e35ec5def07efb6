package main

import (
	"github.com/kscope-dev/kscope/policy"
	"github.com/kscope-dev/kscope/retrytopic"
)

// Where the owner dlt list and dlt show print comes from.
const (
	ownerFromHeader = "header" // the record's kscope-owner header
	ownerFromPolicy = "policy" // the policy file's entry of the record's group
)

// owners finds a dead letter's owner: its kscope-owner header, else the
// policy file's entry of the group that dead-lettered it (its kscope-group
// header, else --group).
type owners struct {
	file  *policy.File // nil without --policy
	group string       // --group
}

// dltOwners returns the owners of a dlt command's records: with the policy
// file --policy or $KSCOPE_POLICY names, if any (one that is not valid is
// a refusal).
func (e *env) dltOwners(group string) (*owners, error) {
	o := &owners{group: group}
	if path := e.policyPath(); path != "" {
		f, err := loadPolicy(path)
		if err != nil {
			return nil, err
		}
		o.file = f
	}
	return o, nil
}

// of returns m's owner and where it comes from ("", "" when neither the
// record nor the policy names one).
func (o *owners) of(m retrytopic.Metadata) (owner, source string) {
	if m.Owner != "" {
		return m.Owner, ownerFromHeader
	}
	if o == nil || o.file == nil {
		return "", ""
	}
	group := m.Group
	if group == "" {
		group = o.group
	}
	if c, ok := o.file.Consumer(group); ok {
		return c.Owner.String(), ownerFromPolicy
	}
	return "", ""
}

// cell returns m's owner as a table cell: "-" when unknown, and marked
// "(policy)" when it comes from the policy file.
func (o *owners) cell(m retrytopic.Metadata, width int) string {
	owner, source := o.of(m)
	if source == ownerFromPolicy {
		return cell(owner, width-len(" (policy)")) + " (policy)"
	}
	return cell(owner, width)
}

// fill sets j's owner from m.
func (o *owners) fill(j *metadataJSON, m retrytopic.Metadata) {
	j.Owner, j.OwnerSource = o.of(m)
}
