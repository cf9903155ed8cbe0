package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"unicode"

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
	h := membersDigest(content)
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

// membersDigest is the SHA-256 of a configuration rewritten so that the
// slots its servers sit in do not matter: in every run of consecutive
// "server" lines, the server name (the slot) is dropped and the lines are
// sorted ("server" and the other fields joined by one space). Everything
// else is kept as it is. The rewriting is hashed as it is made, one run
// of server lines at a time: at 10,000 backends the configuration is tens
// of megabytes, which every scrape of the metrics copied four times over.
func membersDigest(cfg []byte) [sha256.Size]byte {
	h := sha256.New()
	var buf []byte   // the run's rewritten lines, back to back
	var run [][2]int // where each of them is in buf
	flush := func() {
		slices.SortFunc(run, func(a, b [2]int) int { return bytes.Compare(buf[a[0]:a[1]], buf[b[0]:b[1]]) })
		for _, r := range run {
			h.Write(buf[r[0]:r[1]])
		}
		buf, run = buf[:0], run[:0]
	}
	for line := range bytes.Lines(cfg) {
		rest, ok := afterServerName(line)
		if !ok {
			flush()
			h.Write(line)
			continue
		}
		start := len(buf)
		buf = append(buf, "server"...)
		for f, rest := cutField(rest); len(f) > 0; f, rest = cutField(rest) {
			buf = append(append(buf, ' '), f...)
		}
		if len(buf) == start+len("server") {
			buf = append(buf, ' ')
		}
		buf = append(buf, '\n')
		run = append(run, [2]int{start, len(buf)})
	}
	flush()
	return [sha256.Size]byte(h.Sum(nil))
}

// afterServerName reports whether line is a server line ("server" and a
// name at least) and returns what follows the name.
func afterServerName(line []byte) ([]byte, bool) {
	kw, rest := cutField(line)
	if string(kw) != "server" {
		return nil, false
	}
	name, rest := cutField(rest)
	return rest, len(name) > 0
}

// cutField returns b's first field, as strings.Fields splits them, and
// what follows it.
func cutField(b []byte) (field, rest []byte) {
	b = bytes.TrimLeftFunc(b, unicode.IsSpace)
	i := bytes.IndexFunc(b, unicode.IsSpace)
	if i < 0 {
		return b, nil
	}
	return b[:i], b[i:]
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
