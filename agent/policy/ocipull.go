package policy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Back-off between rounds of failed pulls.
const (
	pullBackoffBase = time.Second
	pullBackoffMax  = 5 * time.Minute
)

// errPullPending: the module is not in the store and no pull of it has
// failed yet (the first pull is on its way). Not worth an event.
var errPullPending = errors.New("not pulled yet")

// puller is the state of the background pulls. Reload never waits for the
// network: it loads registry modules from the store only, and wakes the
// puller when the configuration names new ones.
type puller struct {
	fetcher fetcher
	// wake has room for one signal: a wake-up while a round runs is kept
	// for the next round.
	wake chan struct{}

	// mu protects errs.
	mu sync.Mutex
	// errs is the last pull error of each module digest still failing.
	errs map[string]error
}

func newPuller(opts RegistryOptions) *puller {
	return &puller{fetcher: fetcher{opts: opts}, wake: make(chan struct{}, 1), errs: map[string]error{}}
}

func (p *puller) wakeUp() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *puller) lastErr(digest string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.errs[digest]
}

func (p *puller) setErr(digest string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil {
		delete(p.errs, digest)
		return
	}
	p.errs[digest] = err
}

// configRefs lists the registry modules of a configuration, in its order.
func configRefs(cfg *Config) []ociRef {
	var refs []ociRef
	for _, pc := range cfg.Policies {
		if !isOCI(pc.Module) {
			continue
		}
		if r, err := parseOCIRef(pc.Module); err == nil { // Validate refused the others
			refs = append(refs, r)
		}
	}
	return refs
}

// moduleBytes reads a module: a local file, or a registry module from the
// store (never from the network: see pullLoop).
func (m *Manager) moduleBytes(path string) ([]byte, error) {
	if !isOCI(path) {
		return readModule(path)
	}
	r, err := parseOCIRef(path)
	if err != nil {
		return nil, err
	}
	if m.opts.Modules == nil {
		return nil, errors.New("a module from a registry needs the agent's state store to keep it")
	}
	b, err := m.storedModule(r)
	if err == nil {
		return b, nil
	}
	// Absent, damaged and quarantined by the store, or not the module pinned:
	// either way the puller fetches it (again).
	if pullErr := m.pulls.lastErr(r.digest.String()); pullErr != nil {
		return nil, fmt.Errorf("%w; pull: %w", err, pullErr)
	}
	if errors.Is(err, errNotStored) {
		return nil, errPullPending
	}
	return nil, err
}

// errNotStored: the store has no module of that digest.
var errNotStored = errors.New("not in the state store")

// storedModule returns the module of r the store keeps, checked against the
// digest r pins (artifact.verify) at every load: the store's checksums catch
// a damaged record, not one written on purpose.
func (m *Manager) storedModule(r ociRef) ([]byte, error) {
	b, err := m.opts.Modules.GetPolicyModule(r.digest.String())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errNotStored, err)
	}
	a, err := decodeArtifact(b)
	if err == nil {
		err = a.verify(r)
	}
	if err != nil {
		return nil, fmt.Errorf("the copy in the state store is not the module pinned, refused: %w", err)
	}
	return a.module, nil
}

// pullLoop pulls the registry modules the configuration names and the store
// lacks, when Reload finds new ones and, after a failure, with back-off; each
// round that changed something reloads. It returns when ctx is done.
func (m *Manager) pullLoop(ctx context.Context) {
	delay := pullBackoffBase
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.pulls.wake:
			delay = pullBackoffBase // a new configuration: its modules now
		case <-retry.C:
		}
		changed, failed := m.pullMissing(ctx)
		if ctx.Err() != nil {
			return
		}
		if changed {
			if err := m.Reload(ctx); err != nil {
				m.logger.Error("policy reload after pull", "err", err)
			}
		}
		if failed {
			m.logger.Info("policy modules not all pulled; retrying", "retryIn", delay)
			retry.Reset(delay)
			delay = min(2*delay, pullBackoffMax)
		} else {
			retry.Stop()
		}
	}
}

// pullMissing pulls each module of the configuration absent from the store.
// changed: a module was stored or a pull error changed (Status and the
// events must say so); failed: a pull failed and is worth retrying.
func (m *Manager) pullMissing(ctx context.Context) (changed, failed bool) {
	if m.opts.Modules == nil {
		return false, false
	}
	for _, r := range m.current.Load().refs {
		key := r.digest.String()
		if _, err := m.storedModule(r); err == nil {
			continue
		} else if !errors.Is(err, errNotStored) {
			m.logger.Warn("policy module in the state store refused; pulling it again", "module", r.String(), "err", err)
		}
		a, err := m.pulls.fetcher.fetch(ctx, r)
		if err == nil {
			if err = m.opts.Modules.PutPolicyModule(key, encodeArtifact(a)); err != nil {
				err = fmt.Errorf("keep in the state store: %w", err)
			}
		}
		if ctx.Err() != nil {
			return changed, failed // stopping: not a failure of the registry
		}
		if err != nil {
			failed = true
			m.logger.Warn("policy module not pulled", "module", r.String(), "err", err)
		} else {
			m.logger.Info("policy module pulled", "module", r.String(), "bytes", len(a.module))
		}
		prev := m.pulls.lastErr(key)
		m.pulls.setErr(key, err)
		if err == nil || prev == nil || prev.Error() != err.Error() {
			changed = true
		}
	}
	return changed, failed
}

// Failure is a policy whose configured module failed to pull or to load.
type Failure struct {
	Policy string
	// Module is the module configured, which failed.
	Module string
	// Serving is the digest of the older module that keeps serving, "" if
	// none does (the policy's failurePolicy then applies).
	Serving string
	Err     error
}

// reportFailure tells OnFailure about a policy's new error: not the same
// error again (a retry), and not a first pull still on its way.
func (m *Manager) reportFailure(pc PolicyConfig, prev, now *loaded, err error) {
	if m.opts.OnFailure == nil || errors.Is(err, errPullPending) {
		return
	}
	if prev != nil && prev.err != nil && prev.err.Error() == err.Error() {
		return
	}
	f := Failure{Policy: pc.Name, Module: pc.Module, Err: err}
	if now.module != nil {
		f.Serving = now.digest
	}
	m.opts.OnFailure(f)
}

// collectModules deletes the stored modules that neither the configuration
// names nor a policy serves. Reload calls it only when every policy serves
// its configured module: while one does not (a new version failing, or a
// boot on a version that does not load), the older versions are kept, so
// that rolling back to one of them works with no registry.
func (m *Manager) collectModules(snap *snapshot) {
	if m.opts.Modules == nil {
		return
	}
	keep := map[string]bool{}
	for _, r := range snap.refs {
		keep[r.digest.String()] = true
	}
	for _, l := range snap.policies {
		if r, err := parseOCIRef(l.cfg.Module); err == nil && l.module != nil {
			keep[r.digest.String()] = true
		}
	}
	stored, err := m.opts.Modules.PolicyModules()
	if err != nil {
		m.logger.Warn("list stored policy modules; none collected", "err", err)
		return
	}
	for _, d := range stored {
		if keep[d] {
			continue
		}
		if err := m.opts.Modules.DeletePolicyModule(d); err != nil {
			m.logger.Warn("delete unused policy module", "digest", d, "err", err)
			continue
		}
		m.logger.Info("unused policy module deleted from the state store", "digest", d)
	}
}
