package nodeapi

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	pathpkg "path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/lru"

	"github.com/holdfast-dev/holdfast/agent/kube"
)

// Cache lifetimes, the kubelet's webhook defaults.
const (
	tokenCacheTTL        = 2 * time.Minute
	tokenFailureCacheTTL = 10 * time.Second
	authzAllowedTTL      = 5 * time.Minute
	authzDeniedTTL       = 30 * time.Second
	// maxCacheEntries bounds each cache (tokens that authenticated, tokens that did not,
	// authorization decisions), the least recently used out first. The tokens that
	// authenticated and those that did not are kept apart, so that a flood of made-up tokens
	// evicts made-up tokens only.
	maxCacheEntries = 4096
	// tokenReviewRate (per second) and tokenReviewBurst bound the TokenReviews that tokens in
	// neither cache cost: each is a request over the uplink, which may be metered, and anyone
	// who reaches the port can send tokens. Past it a request is answered 429 without a review
	// (holdfast_nodeapi_token_reviews_limited_total counts them). Clients in the cluster
	// present the same token for its lifetime and hit the cache.
	tokenReviewRate  = 5
	tokenReviewBurst = 20
	// sourceReviewRate (per second) and sourceReviewBurst bound the TokenReviews of one
	// client address (an IPv6 one by its /64, which a host commonly holds whole) within the
	// node's: a flood of made-up tokens from one source is refused before it spends the
	// budget, and new tokens from elsewhere still get reviewed while it lasts. Sources are
	// remembered in an LRU of maxCacheEntries.
	sourceReviewRate  = 1
	sourceReviewBurst = 10
	// maxTokenBytes is the longest bearer token reviewed: a service account's or an OIDC token
	// is a few KiB; each review carries the token over the uplink, and a header may be 1 MiB.
	maxTokenBytes = 16 << 10
	// reviewTimeout bounds one TokenReview or SubjectAccessReview.
	reviewTimeout = 10 * time.Second
)

// userInfo is an authenticated client.
type userInfo struct {
	Name   string
	UID    string
	Groups []string
	Extra  map[string][]string
}

// Errors of authentication and authorization; the handler maps them to HTTP statuses.
var (
	errUnauthenticated = errors.New("Unauthorized")
	// errReviewUnavailable: the apiserver could not be asked (out of reach).
	errReviewUnavailable = errors.New("the apiserver, which authenticates and authorizes node API requests, is out of reach")
	// errTooManyReviews: the token is new and the TokenReview budget is spent.
	errTooManyReviews = errors.New("too many new bearer tokens on this node: their TokenReviews are rate-limited; retry later")
)

// authenticator knows the clients: certificates of the client CA, tokens through TokenReview.
type authenticator struct {
	clientCAs *x509.CertPool // nil: no certificate is accepted
	client    kube.Interface
	now       func() time.Time

	valid   *lru.Cache // token hash -> tokenResult that authenticated
	refused *lru.Cache // token hash -> tokenResult that did not
	limiter *rate.Limiter
	sources sourceBudgets      // each client address's share of limiter
	flight  singleflight.Group // one TokenReview at a time per token

	reviews, limited atomic.Uint64 // TokenReviews sent, and not sent for the rate
}

func newAuthenticator(client kube.Interface, now func() time.Time) *authenticator {
	return &authenticator{client: client, now: now,
		valid: lru.New(maxCacheEntries), refused: lru.New(maxCacheEntries),
		limiter: rate.NewLimiter(tokenReviewRate, tokenReviewBurst),
		sources: sourceBudgets{limiters: lru.New(maxCacheEntries)}}
}

// sourceBudgets holds a TokenReview budget per client address.
type sourceBudgets struct {
	mu       sync.Mutex // makes a source's get-or-create one step
	limiters *lru.Cache // source -> *rate.Limiter
}

// take takes one review from source's budget; ok is false when it is spent. undo gives the
// review back, for one the node's budget then refuses: a client retrying while others flood
// the node must not spend its own budget on reviews never sent.
func (b *sourceBudgets) take(source string, now time.Time) (ok bool, undo func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var l *rate.Limiter
	if v, ok := b.limiters.Get(source); ok {
		l = v.(*rate.Limiter)
	} else {
		l = rate.NewLimiter(sourceReviewRate, sourceReviewBurst)
		b.limiters.Add(source, l)
	}
	r := l.ReserveN(now, 1)
	if !r.OK() || r.DelayFrom(now) > 0 {
		r.CancelAt(now)
		return false, nil
	}
	return true, func() { r.CancelAt(now) }
}

// reviewSource names the client of r for its review budget: its IP address, an IPv6 one cut
// to its /64. A RemoteAddr that does not parse (no such listener here) is a source of its own.
func reviewSource(r *http.Request) string {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	ip := ap.Addr().Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

type tokenResult struct {
	user    *userInfo // nil: not authenticated
	expires time.Time
}

// authenticate returns the request's user, errUnauthenticated, or errReviewUnavailable.
func (a *authenticator) authenticate(r *http.Request) (*userInfo, error) {
	if u := a.fromCertificate(r); u != nil {
		return u, nil
	}
	token, ok := bearerToken(r)
	if !ok {
		return nil, errUnauthenticated
	}
	return a.fromToken(r.Context(), token, reviewSource(r))
}

// fromCertificate returns the user of a client certificate that verifies against the client
// CA (CN: name, O: groups, as the kubelet's x509 authenticator), or nil.
func (a *authenticator) fromCertificate(r *http.Request) *userInfo {
	if a.clientCAs == nil || r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return nil
	}
	leaf := r.TLS.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range r.TLS.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{
		Roots:         a.clientCAs,
		Intermediates: inter,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		CurrentTime:   a.now(),
	})
	if err != nil || leaf.Subject.CommonName == "" {
		return nil
	}
	return &userInfo{Name: leaf.Subject.CommonName, Groups: slices.Clone(leaf.Subject.Organization)}
}

func bearerToken(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

func (a *authenticator) fromToken(ctx context.Context, token, source string) (*userInfo, error) {
	if a.client == nil || len(token) > maxTokenBytes {
		return nil, errUnauthenticated
	}
	sum := sha256.Sum256([]byte(token))
	key := hex.EncodeToString(sum[:])
	if res, ok := a.cached(key); ok {
		return res.answer()
	}
	// Requests with the same new token share one review; the first to find the budget spent
	// answers them all.
	v, err, _ := a.flight.Do(key, func() (any, error) {
		if res, ok := a.cached(key); ok {
			return res, nil
		}
		now := a.now()
		// The source's budget first: a source past its own spends none of the node's.
		ok, undo := a.sources.take(source, now)
		if ok && !a.limiter.AllowN(now, 1) {
			undo()
			ok = false
		}
		if !ok {
			a.limited.Add(1)
			return nil, errTooManyReviews
		}
		a.reviews.Add(1)
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reviewTimeout)
		defer cancel()
		tr, err := a.client.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("%w: TokenReview: %v", errReviewUnavailable, err)
		}
		if !tr.Status.Authenticated {
			res := tokenResult{expires: now.Add(tokenFailureCacheTTL)}
			a.refused.Add(key, res)
			return res, nil
		}
		u := tr.Status.User
		res := tokenResult{expires: now.Add(tokenCacheTTL), user: &userInfo{Name: u.Username, UID: u.UID, Groups: u.Groups, Extra: map[string][]string{}}}
		for k, v := range u.Extra {
			res.user.Extra[k] = v
		}
		a.valid.Add(key, res)
		a.refused.Remove(key)
		return res, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(tokenResult).answer()
}

// cached returns the token's unexpired result, if a cache has one.
func (a *authenticator) cached(key string) (tokenResult, bool) {
	now := a.now()
	for _, c := range []*lru.Cache{a.valid, a.refused} {
		if v, ok := c.Get(key); ok {
			if res := v.(tokenResult); now.Before(res.expires) {
				return res, true
			}
			c.Remove(key)
		}
	}
	return tokenResult{}, false
}

func (r tokenResult) answer() (*userInfo, error) {
	if r.user == nil {
		return nil, errUnauthenticated
	}
	return r.user, nil
}

// attributes is what is authorized: verb on nodes/NAME/SUBRESOURCE.
type attributes struct {
	Verb        string
	Subresource string
}

// requestAttributes maps a request to the attributes the kubelet checks, in order: the request
// is allowed when one of them is (the kubelet's nodeAuthorizerAttributesGetter, fine-grained
// authorization on).
//
// Exec, attach and port-forward are create whatever the method: they run a command in a pod or
// open its network, and their WebSocket form is a GET, which the kubelet authorizes as get, so
// that a caller allowed only to read (get nodes/proxy, commonly granted to monitoring) could
// exec into every pod on the node. The path is judged as the router will see it, cleaned.
func requestAttributes(method, urlPath string) []attributes {
	path := pathpkg.Clean("/" + urlPath)
	verb := ""
	switch method {
	case http.MethodPost:
		verb = "create"
	case http.MethodGet, http.MethodHead:
		verb = "get"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
	}
	if opensPod(path) {
		verb = "create"
	}
	var subs []string
	switch {
	case isSubpath(path, "/pods"), isSubpath(path, "/runningpods"):
		subs = append(subs, "pods")
	case isSubpath(path, "/healthz"):
		subs = append(subs, "healthz")
	case isSubpath(path, "/configz"):
		subs = append(subs, "configz")
	}
	switch {
	case isSubpath(path, "/stats"):
		subs = append(subs, "stats")
	case isSubpath(path, "/metrics"):
		subs = append(subs, "metrics")
	case isSubpath(path, "/logs"):
		subs = append(subs, "log")
	case isSubpath(path, "/checkpoint"):
		subs = append(subs, "checkpoint")
	default:
		subs = append(subs, "proxy")
	}
	out := make([]attributes, 0, len(subs))
	for _, s := range subs {
		out = append(out, attributes{Verb: verb, Subresource: s})
	}
	return out
}

// opensPod says whether path is one of the streams into a pod: exec, attach, portForward (and
// the kubelet's run, which holdfast does not serve).
func opensPod(path string) bool {
	for _, p := range []string{"/exec", "/attach", "/portForward", "/run"} {
		if isSubpath(path, p) {
			return true
		}
	}
	return false
}

func isSubpath(sub, path string) bool {
	path = strings.TrimSuffix(path, "/")
	return sub == path || strings.HasPrefix(sub, path) && sub[len(path)] == '/'
}

// authorizer asks the apiserver with SubjectAccessReviews, and remembers the answers.
type authorizer struct {
	client   kube.Interface
	nodeName string
	now      func() time.Time

	decisions *lru.Cache // SubjectAccessReview spec -> decision
}

type decision struct {
	allowed bool
	reason  string
	expires time.Time
}

// authorize returns whether u may do a on this node, with the reviewer's reason, or
// errReviewUnavailable.
func (z *authorizer) authorize(ctx context.Context, u *userInfo, a attributes) (bool, string, error) {
	spec := authzv1.SubjectAccessReviewSpec{
		User: u.Name, UID: u.UID, Groups: u.Groups,
		ResourceAttributes: &authzv1.ResourceAttributes{
			Verb: a.Verb, Version: "v1", Resource: "nodes", Subresource: a.Subresource, Name: z.nodeName,
		},
	}
	if len(u.Extra) > 0 {
		spec.Extra = map[string]authzv1.ExtraValue{}
		for k, v := range u.Extra {
			spec.Extra[k] = v
		}
	}
	keyJSON, _ := json.Marshal(spec)
	key := string(keyJSON)
	now := z.now()
	if v, ok := z.decisions.Get(key); ok {
		if d := v.(decision); now.Before(d.expires) {
			return d.allowed, d.reason, nil
		}
	}

	ctx, cancel := context.WithTimeout(ctx, reviewTimeout)
	defer cancel()
	sar, err := z.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		return false, "", fmt.Errorf("%w: SubjectAccessReview: %v", errReviewUnavailable, err)
	}
	d := decision{allowed: sar.Status.Allowed, reason: sar.Status.Reason, expires: now.Add(authzDeniedTTL)}
	if d.allowed {
		d.expires = now.Add(authzAllowedTTL)
	}
	z.decisions.Add(key, d)
	return d.allowed, d.reason, nil
}

// TokenReviews returns how many TokenReviews the node API has sent.
func (s *Server) TokenReviews() uint64 { return s.authn.reviews.Load() }

// TokenReviewsLimited returns how many requests with a new token were answered 429 because the
// TokenReview budget was spent.
func (s *Server) TokenReviewsLimited() uint64 { return s.authn.limited.Load() }
