package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"

	"github.com/seamless-lb/seamless/entrypoint/status"
	"github.com/seamless-lb/seamless/internal/regular"
)

// fingerprint is what a replica tells its fleet about the configuration
// HAProxy runs, so that replicas can be compared: /status's config and
// the metric seamless_config_info.
//
// SHA256 is the digest of the running file (with several files, of their
// "digest  path" lines, as sha256sum prints them). Replicas that read the
// same catalog through the same history render byte-identical files: the
// built-in template carries no time, host name or random value, and
// services, routes and instances are sorted. But a server slot is kept by
// its instance for as long as it lives (so that membership changes over
// the runtime API), so two replicas that saw the same members arrive in a
// different order, or one that missed an intermediate catalog while its
// agent was cut off, legitimately put them in different slots.
// MembersSHA256 is the digest with that one difference taken out: each
// backend's server lines sorted, without their slot names. Equal
// MembersSHA256 means the same frontends, routes, backends and servers.
func fingerprint(files []status.ConfigFile, discovery bool) status.Fingerprint {
	var fp status.Fingerprint
	var sums []string
	for _, f := range files {
		run := f.RunningSHA256
		if f.Error != "" || run == "" {
			return fp // unknown: better none than a wrong one
		}
		sums = append(sums, run+"  "+f.Path+"\n")
	}
	switch len(sums) {
	case 0:
		return fp
	case 1:
		fp.SHA256 = files[0].RunningSHA256
	default:
		h := sha256.Sum256([]byte(strings.Join(sums, "")))
		fp.SHA256 = hex.EncodeToString(h[:])
	}
	// The members' digest needs the running content: in discovery mode
	// the rendered file is what runs; in drop-in mode only while the file
	// on disk is still the one HAProxy loaded.
	if len(files) != 1 || (!discovery && files[0].SHA256 != files[0].RunningSHA256) {
		return fp
	}
	content, ok := readRunning(files[0].Path, files[0].RunningSHA256)
	if !ok {
		return fp
	}
	h := sha256.Sum256(membersCanonical(content))
	fp.MembersSHA256 = hex.EncodeToString(h[:])
	return fp
}

// readRunning reads path if its content still has the digest want (it may
// have been replaced since it was hashed).
func readRunning(path, want string) ([]byte, bool) {
	f, _, err := regular.Open(path)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(f); err != nil {
		return nil, false
	}
	h := sha256.Sum256(b.Bytes())
	return b.Bytes(), hex.EncodeToString(h[:]) == want
}

// membersCanonical rewrites a configuration so that the slots its servers
// sit in do not matter: in every run of consecutive "server" lines, the
// server name (the slot) is dropped and the lines are sorted. Everything
// else is kept as it is.
func membersCanonical(cfg []byte) []byte {
	var out, run []string
	flush := func() {
		slices.Sort(run)
		out = append(out, run...)
		run = run[:0]
	}
	for line := range strings.Lines(string(cfg)) {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "server" {
			run = append(run, "server "+strings.Join(f[2:], " ")+"\n")
			continue
		}
		flush()
		out = append(out, line)
	}
	flush()
	return []byte(strings.Join(out, ""))
}

// runningFingerprint fingerprints what runs now, as /status describes it:
// in discovery mode the rendered file on disk, in drop-in mode the files
// as loaded by the last confirmed reload.
func runningFingerprint(paths []string, discovery bool, reloads *reloadLog) status.Fingerprint {
	files := configFiles(paths)
	switch {
	case discovery:
		for i := range files {
			files[i].RunningSHA256 = files[i].SHA256
		}
	case reloads != nil:
		reloads.annotate(files)
	}
	return fingerprint(files, discovery)
}
