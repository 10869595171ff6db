import type { rule } from './bot_traffic.ts';
import { keyWindow, MINUTE, spread, T0, type RuleFixture } from './fixtures.ts';

type Fixture = RuleFixture<(typeof rule)['defaults']>;

const TEN_MINUTES_AGO = T0 - 10 * MINUTE;
const HEADLESS_CHROME = 'Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) HeadlessChrome/131.0.6778.33 Safari/537.36';
const ORDINARY = spread(100, TEN_MINUTES_AGO, 10 * MINUTE);
/** A session read as a fleet that sends route templates reports it (contracts section 1). */
const TEMPLATE = '/v1/verify/sessions/:id';
/** GETs of distinct session ids, as an enumerating client makes them. */
const walk = (count: number, userAgent: string, status = 200) =>
  spread(count, TEN_MINUTES_AGO, 10 * MINUTE, (i) => ({ userAgent, method: 'GET', path: `/v1/verify/sessions/ses_${100_000 + i}`, status, ip: '192.0.2.99' }));

export const fixtures: Fixture[] = [
  {
    name: 'one sqlmap request suffices: critical',
    kind: 'positive',
    window: keyWindow([...ORDINARY, { at: T0 - 2 * MINUTE, userAgent: 'sqlmap/1.8.4#stable (https://sqlmap.org)', path: "/v1/verify/sessions?id=1' OR '1'='1", status: 400 }]),
    now: T0,
    expect: { findings: 1, severity: 'critical', evidence: { category: 'attack_tool', tools: { sqlmap: 1 }, requests: 1, succeeded: 0 } },
  },
  {
    name: 'a Nikto scan among ordinary traffic is critical',
    kind: 'positive',
    window: keyWindow([
      ...ORDINARY,
      ...spread(40, T0 - 5 * MINUTE, MINUTE, (i) => ({ userAgent: 'Mozilla/5.00 (Nikto/2.5.0) (Evasions:None) (Test:000' + i + ')', path: `/admin/${i}`, status: 404, ip: '192.0.2.200' })),
    ]),
    now: T0,
    expect: { findings: 1, severity: 'critical', evidence: { tools: { Nikto: 40 }, distinctIps: 1 } },
  },
  {
    name: 'attack tools by their default user agents: ffuf, Nuclei, zgrab, THC Hydra',
    kind: 'positive',
    window: keyWindow([
      ...ORDINARY,
      { at: T0 - 4 * MINUTE, userAgent: 'Fuzz Faster U Fool v2.1.0-dev' },
      { at: T0 - 3 * MINUTE, userAgent: 'Nuclei - Open-source project (github.com/projectdiscovery/nuclei)' },
      { at: T0 - 2 * MINUTE, userAgent: 'Mozilla/5.0 zgrab/0.x' },
      { at: T0 - 1 * MINUTE, userAgent: 'Mozilla/4.0 (Hydra)', status: 401 },
    ]),
    now: T0,
    expect: { findings: 1, severity: 'critical', evidence: { tools: { ffuf: 1, Nuclei: 1, zgrab: 1, 'THC Hydra': 1 } } },
  },
  {
    name: 'attack tools by the names in their user agents: Nessus, Burp Suite, Arachni, Acunetix, OpenVAS, WPScan, masscan, gobuster, Nmap, WhatWeb',
    kind: 'positive',
    window: keyWindow([
      ...ORDINARY,
      ...[
        'Nessus SOAP v0.0.1 (Nessus.org)',
        'Mozilla/5.0 (compatible; Burp Suite Professional/2024.1)',
        'Arachni/v1.6.1.3',
        'Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36 acunetix_wvs_security_test',
        'Mozilla/5.0 [en] (X11, U; OpenVAS-VT 22.4.1)',
        'WPScan v3.8.25 (https://wpscan.com/wordpress-security-scanner)',
        'masscan/1.3 (https://github.com/robertdavidgraham/masscan)',
        'gobuster/3.6',
        'Mozilla/5.0 (compatible; Nmap Scripting Engine; https://nmap.org/book/nse.html)',
        'WhatWeb/0.5.5',
      ].map((userAgent, i) => ({ at: T0 - (9 - i) * MINUTE, userAgent, status: 404 })),
    ]),
    now: T0,
    expect: {
      findings: 1,
      severity: 'critical',
      evidence: { tools: { Nessus: 1, 'Burp Suite': 1, Arachni: 1, Acunetix: 1, OpenVAS: 1, WPScan: 1, masscan: 1, gobuster: 1, Nmap: 1, WhatWeb: 1 }, requests: 10 },
    },
  },
  {
    name: 'attack tools by their default user agents: kiterunner, GoLismero, Vega',
    kind: 'positive',
    window: keyWindow([
      ...ORDINARY,
      ...[
        'Chrome. Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/88.0.4324.96 Safari/537.36',
        'Mozilla/5.0 (compatible, GoLismero/2.0 The Web Knife; +https://github.com/golismero/golismero)',
        'Mozilla/4.0 (compatible; MSIE 8.0; Windows NT 6.1; Trident/4.0; SLCC2; .NET CLR 2.0.50727; .NET CLR 3.5.30729; Vega/1.0',
      ].map((userAgent, i) => ({ at: T0 - (3 - i) * MINUTE, userAgent, status: 404 })),
    ]),
    now: T0,
    expect: { findings: 1, severity: 'critical', evidence: { tools: { kiterunner: 1, GoLismero: 1, Vega: 1 }, requests: 3 } },
  },
  {
    name: 'HeadlessChrome walking 60 session ids is medium',
    kind: 'positive',
    window: keyWindow([...ORDINARY, ...walk(60, HEADLESS_CHROME)]),
    now: T0,
    expect: { findings: 1, severity: 'medium', evidence: { category: 'automation', tools: { HeadlessChrome: 60 }, distinctResources: 60 } },
  },
  {
    name: 'Scrapy walking 200 session ids is high',
    kind: 'positive',
    window: keyWindow(walk(200, 'Scrapy/2.11.2 (+https://scrapy.org)')),
    now: T0,
    expect: { findings: 1, severity: 'high', evidence: { tools: { Scrapy: 200 }, distinctResources: 200 } },
  },
  {
    name: 'PhantomJS walking ids that mostly do not exist (404) is high',
    kind: 'positive',
    window: keyWindow(walk(40, 'Mozilla/5.0 (Unknown; Linux x86_64) AppleWebKit/538.1 (KHTML, like Gecko) PhantomJS/2.1.1 Safari/538.1', 404)),
    now: T0,
    expect: { findings: 1, severity: 'high', evidence: { notFoundShare: 1 } },
  },
  {
    name: 'ordinary HTTP libraries walking many sessions are server-side integrations, never an alert',
    kind: 'negative',
    window: keyWindow(
      [
        'curl/8.7.1',
        'python-requests/2.32.3',
        'axios/1.7.7',
        'okhttp/4.12.0',
        'Go-http-client/2.0',
        'Java/17.0.2',
        'Apache-HttpClient/5.3 (Java/21.0.1)',
        'node-fetch/1.0 (+https://github.com/bitinn/node-fetch)',
        'undici',
        'Ruby',
        'Faraday v2.9.0',
        'GuzzleHttp/7',
        'Microsoft.NET/HttpClient',
        'Wget/1.21.4',
      ].flatMap((userAgent, k) => walk(50, userAgent).map((spec, i) => ({ ...spec, path: `/v1/verify/sessions/ses_${k}_${i}` }))),
    ),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'an empty user agent, even on many resources, is not an alert by itself',
    kind: 'negative',
    window: keyWindow(walk(200, '')),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'a headless browser in the merchant\'s end-to-end tests touching a few resources is quiet',
    kind: 'negative',
    window: keyWindow([...ORDINARY, ...spread(25, TEN_MINUTES_AGO, 10 * MINUTE, (i) => ({ userAgent: HEADLESS_CHROME, path: `/v1/verify/sessions/ses_test_${i % 5}` }))]),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'ordinary browsers (a merchant testing by hand) are not bots',
    kind: 'negative',
    window: keyWindow([
      ...walk(40, 'Mozilla/5.0 (Macintosh; Intel Mac OS X 14_5) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Safari/605.1.15'),
      ...walk(40, 'Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36'),
    ]),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'a user agent naming Ory Hydra (an OAuth server) is not THC Hydra',
    kind: 'negative',
    window: keyWindow(spread(50, TEN_MINUTES_AGO, 10 * MINUTE, { userAgent: 'ory-hydra/v2.2.0 Go-http-client/1.1' })),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'ordinary products whose names contain a tool\'s (BusinessUserSync, AcmeBusinessUsers, Burpple, Arachnid, NucleiCount, Vega) are not attack tools',
    kind: 'negative',
    window: keyWindow(
      [
        'BusinessUserSync/2.4 python-requests/2.31.0',
        'AcmeBusinessUsers-Importer/1.0 (+https://acme.example)',
        'Burpple/5.3.1 (iPhone; iOS 17.2; Scale/3.00)',
        'Arachnid/0.9 Go-http-client/1.1',
        'NucleiCount/3.1 okhttp/4.12.0',
        // Vega only in its own form; kiterunner's prefix only at the start.
        'vega/1.0',
        'LyraVega/1.0 (Android 14)',
        'Mozilla/5.0 (Linux; Android 13; Vega/1.0) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Mobile Safari/537.36',
        'MyPlayer/3.2 (tvOS; Vega/1.0)',
        'MyApp/2.0 Chrome. Mozilla/5.0 (X11; Linux x86_64)',
      ].flatMap((userAgent, k) => spread(20, TEN_MINUTES_AGO, 10 * MINUTE, (i) => ({ userAgent, path: `/v1/verify/sessions/ses_${k}_${i}` }))),
    ),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'a sqlmap request 20 minutes ago is outside the window',
    kind: 'negative',
    window: keyWindow([{ at: T0 - 20 * MINUTE, userAgent: 'sqlmap/1.8.4#stable (https://sqlmap.org)' }, ...ORDINARY]),
    now: T0,
    expect: { findings: 0 },
  },

  // Route templates (contracts section 1): every session read is one path, so reads count on their own.
  {
    name: 'a headless browser reading 300 sessions in 10 minutes through a route template is medium',
    kind: 'positive',
    window: keyWindow([...ORDINARY, ...spread(300, TEN_MINUTES_AGO, 10 * MINUTE, { userAgent: HEADLESS_CHROME, method: 'GET', path: TEMPLATE, status: 200, ip: '192.0.2.99' })]),
    now: T0,
    expect: { findings: 1, severity: 'medium', title: /read 300 times/, evidence: { category: 'automation', tools: { HeadlessChrome: 300 }, distinctResources: 1, reads: 300, minAutomationReads: 100 } },
  },
  {
    name: 'Scrapy reading 700 sessions in 10 minutes through a route template is high',
    kind: 'positive',
    window: keyWindow(spread(700, TEN_MINUTES_AGO, 10 * MINUTE, { userAgent: 'Scrapy/2.11.2 (+https://scrapy.org)', method: 'GET', path: TEMPLATE, status: 200 })),
    now: T0,
    expect: { findings: 1, severity: 'high', evidence: { reads: 700, distinctResources: 1 } },
  },
  {
    name: 'a headless browser in the merchant\'s end-to-end tests reading 60 sessions through a route template is quiet',
    kind: 'negative',
    window: keyWindow([...ORDINARY, ...spread(60, TEN_MINUTES_AGO, 10 * MINUTE, { userAgent: HEADLESS_CHROME, method: 'GET', path: TEMPLATE, status: 200 })]),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'a backup client whose name starts with a crawler\'s word (SpiderOakONE) reading at volume is not a crawler',
    kind: 'negative',
    window: keyWindow(spread(300, TEN_MINUTES_AGO, 10 * MINUTE, { userAgent: 'SpiderOakONE/7.5.0 (Linux; x86_64)', method: 'GET', path: TEMPLATE, status: 200 })),
    now: T0,
    expect: { findings: 0 },
  },

  {
    name: 'apps whose names hold a scraper\'s or crawler\'s word (ScrapyardPOS, PubCrawl, Spider-Man Unlimited) reading at volume are not scrapers',
    kind: 'negative',
    window: keyWindow(
      ['ScrapyardPOS/3.2 (iPad; iOS 17.5)', 'PubCrawl/2.4 (iPhone; iOS 17.5; Scale/3.00)', 'Spider-Man Unlimited/4.6.0 (Android 14)'].flatMap((userAgent) =>
        spread(200, TEN_MINUTES_AGO, 10 * MINUTE, { userAgent, method: 'GET', path: TEMPLATE, status: 200 }),
      ),
    ),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'Colly\'s default user agent reading 150 sessions in 10 minutes is a scraper (medium)',
    kind: 'positive',
    window: keyWindow(spread(150, TEN_MINUTES_AGO, 10 * MINUTE, { userAgent: 'colly - https://github.com/gocolly/colly/v2', method: 'GET', path: TEMPLATE, status: 200 })),
    now: T0,
    expect: { findings: 1, severity: 'medium', evidence: { tools: { Colly: 150 } } },
  },

  // Attack tools' names as tokens: a product built around a tool is not the tool.
  {
    name: 'products built around a tool\'s name, joined by a hyphen (Nmap-Parser, python-nmap-report, Nuclei-Sync), are not attack tools',
    kind: 'negative',
    window: keyWindow(
      ['Nmap-Parser/1.2', 'python-nmap-report/1.0', 'Nuclei-Sync/2.0 (+https://nuclei-sync.example)'].flatMap((userAgent, k) =>
        spread(20, TEN_MINUTES_AGO, 10 * MINUTE, (i) => ({ userAgent, path: `/v1/verify/sessions/ses_${k}_${i}` })),
      ),
    ),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'OpenVAS by its current user agent (Greenbone OS) and tools whose version follows a hyphen (DirBuster-1.0-RC1) are critical',
    kind: 'positive',
    window: keyWindow([
      ...ORDINARY,
      { at: T0 - 3 * MINUTE, userAgent: 'Mozilla/5.0 [en] (X11, U; Greenbone OS 22.04.27)', status: 404 },
      { at: T0 - 2 * MINUTE, userAgent: 'DirBuster-1.0-RC1 (http://www.owasp.org/index.php/Category:OWASP_DirBuster_Project)', status: 404 },
    ]),
    now: T0,
    expect: { findings: 1, severity: 'critical', evidence: { tools: { OpenVAS: 1, DirBuster: 1 } } },
  },

  // Nuclei, Wapiti and commix are also words of products' names: only the forms the tools send count.
  {
    name: 'Nuclei, Wapiti and commix by the forms they send (name, "/" and a version; projectdiscovery, wapiti-scanner, commixproject) are critical',
    kind: 'positive',
    window: keyWindow([
      ...ORDINARY,
      ...[
        'Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36 Nuclei - Open-source project (github.com/projectdiscovery/nuclei)',
        'nuclei/3.3.7',
        'Wapiti/3.2.0',
        'Mozilla/5.0 (compatible; +https://github.com/wapiti-scanner/wapiti)',
        'commix/v3.9-stable (https://commixproject.com)',
      ].map((userAgent, i) => ({ at: T0 - (5 - i) * MINUTE, userAgent, status: 404 })),
    ]),
    now: T0,
    expect: { findings: 1, severity: 'critical', evidence: { tools: { Nuclei: 2, Wapiti: 2, commix: 1 }, requests: 5 } },
  },
  {
    name: 'products that take Nuclei, Wapiti or commix as a word of their names (Nuclei Health, Commix SDK, Wapiti CRM) are not attack tools',
    kind: 'negative',
    window: keyWindow(
      [
        'Nuclei Health/1.0 (+https://example.com)',
        'Nuclei_Cloud/1.0 okhttp/4.12.0',
        'Commix SDK/2.1 (Android 14)',
        'acme-billing/4.2 (commix)',
        'Wapiti CRM Connector/3.0',
      ].flatMap((userAgent, k) => spread(20, TEN_MINUTES_AGO, 10 * MINUTE, (i) => ({ userAgent, path: `/v1/verify/sessions/ses_${k}_${i}` }))),
    ),
    now: T0,
    expect: { findings: 0 },
  },
  {
    name: 'products whose names join Nuclei, Wapiti or commix to another word (NucleiCloud, CommixPay-SDK, wapiti-crm-connector) are not attack tools',
    kind: 'negative',
    window: keyWindow(
      ['NucleiCloud/1.0 (+https://example.com)', 'CommixPay-SDK/2.1', 'wapiti-crm-connector/3.0'].flatMap((userAgent, k) =>
        spread(20, TEN_MINUTES_AGO, 10 * MINUTE, (i) => ({ userAgent, path: `/v1/verify/sessions/ses_${k}_${i}` })),
      ),
    ),
    now: T0,
    expect: { findings: 0 },
  },
];
