"""Phrase pools of the built-in support-ticket generator (labkit.data.tickets): openings, details, names…"""

from __future__ import annotations

CUE_SENTENCES = {
    "urgent": [
        "This is urgent, please help ASAP.", "Our whole office relies on it and the business is down right now.",
        "Please treat this as an emergency.", "I need this sorted immediately, we are losing money every hour.",
        "I have a client presentation this afternoon, so I need a fix as soon as possible.",
        "Please call me right now, this is critical for us.",
        "We can't take payments at the shop, we need help ASAP.",
        "It's an emergency, my elderly mother relies on it.", "Our team is completely blocked right now.",
        "Please escalate this immediately.", "This is critical, our clinic opens in an hour."],
    "high": [
        "I can't use it at all until this is fixed.", "Honestly it is completely unusable like this.",
        "This is really frustrating.", "I need this fixed today if at all possible.",
        "This is the third time I'm contacting you about it.", "I'm very disappointed with how this has gone.",
        "I'm getting fed up with waiting.", "I really need it fixed today for work.",
        "This is really frustrating, I paid good money for it.",
        "Frankly I can't use it at all for what I bought it for."],
    "low": [
        "No rush on this.", "Whenever you have time is fine.", "Just let me know when you get a chance.",
        "It's not a big deal, just wondering.", "This is low priority for me.", "No hurry, I'm only asking.",
        "Please answer at your convenience.", "No rush at all, thanks.", "Take your time, it's not a big deal.",
        "When you get a chance, could you take a look?"],
}
PRIORITY_WEIGHTS = {  # (low, medium, high, urgent)
    "billing": (15, 45, 28, 12), "technical": (12, 40, 28, 20), "account": (15, 45, 25, 15),
    "shipping": (15, 45, 25, 15), "feedback": (45, 45, 10, 0),
}
OPENINGS = {
    "billing": [
        "I was billed {amount} for my {p} but the price at checkout was lower.",
        "Can you explain the {amount} charge on my card from {date}? It is for the {p}.",
        "My invoice {inv} for the {p} shows the wrong amount.",
        "I returned my {p} {date} and still haven't seen the refund of {amount}.",
        "The promo code I used when buying the {p} was not applied to my bill.",
        "I see two identical payments of {amount} for a single {p} order.",
        "I'd like a copy of the receipt for my {p} purchase, order {order}.",
        "My payment for the {p} keeps getting declined even though my card is fine.",
        "I cancelled the extended warranty on my {p} but I am still billed {amount} a month.",
        "Could you switch the protection plan on my {p} from monthly to yearly billing?",
        "I was promised a price match refund on the {p} but nothing has arrived.",
        "The tax on my {p} invoice looks too high, it says {amount}.",
        "I need to update the credit card used for my {p} protection plan."],
    "technical": [
        "My {p} keeps restarting every few minutes since the {ver} update.",
        "The {p} shows error {err} whenever I try to connect to wifi.",
        "After updating to firmware {ver}, my {p} won't turn on.",
        "The battery on my {p} drains from full to empty in about {n} hours.",
        "My {p} gets very hot while charging and then shuts itself off.",
        "Bluetooth pairing with my {p} fails with code {err}.",
        "The touchscreen on the {p} stops responding after a while.",
        "Since {date}, the {p} drops its connection several times a day.",
        "The companion app crashes every time I open the settings for my {p}.",
        "The {p} won't install update {ver}, it stops at {pct} percent.",
        "The speaker on my {p} crackles at anything above half volume.",
        "The {p} is not detected when I plug it into my computer.",
        "My {p} froze during setup and now shows a blank screen."],
    "account": [
        "I can't log in to the account linked to my {p}, it says my password is wrong.",
        "The password reset email for my {p} account never arrives.",
        "I'd like to change the email address on my {p} account from {email} to a new one.",
        "Someone else seems to have registered my {p} to their account.",
        "My two-factor codes stopped working after I got a new phone, so I'm locked out of my {p} account.",
        "Please delete my account and all data associated with my {p}.",
        "I want to transfer ownership of my {p} to my {relative}.",
        "My account got locked after too many sign-in attempts on the {p}.",
        "How do I merge my two accounts so that my {p} shows up in one place?",
        "The {p} app keeps signing me out of my account every day.",
        "I need to update the name on the account for my {p}, it still shows my old surname.",
        "My profile page says I have no registered devices even though I set up my {p}."],
    "shipping": [
        "My {p} order {order} still hasn't arrived and it was due {date}.",
        "The tracking number {track} for my {p} hasn't updated in {n} days.",
        "The {p} I received was damaged, the box was crushed on one side.",
        "I was sent the wrong colour of the {p}, I ordered the black one.",
        "Can I change the delivery address for my {p} order {order}?",
        "The courier marked my {p} as delivered but nothing came to my door.",
        "Only part of my order arrived, the charger for the {p} is missing.",
        "I'd like to arrange a pickup to return my {p}.",
        "My {p} is stuck in customs and the courier wants an extra fee.",
        "The delivery window for my {p} keeps getting pushed back.",
        "I paid for express shipping on the {p} but it came by standard post.",
        "The parcel with my {p} was left with a neighbour I don't know."],
    "feedback": [
        "I just wanted to say the {p} has been great since I got it.",
        "I have a suggestion for the next version of the {p}.",
        "The new interface on the {p} is harder to use than the old one.",
        "It would be nice if the {p} had a dark mode.",
        "I love the design of my {p}, but the charging cable is too short.",
        "Your team was really helpful when I set up my {p}, thank you.",
        "Could you add more colour options for the {p}?",
        "The {p} manual could explain the setup steps more clearly.", "I think the {p} deserves a longer warranty.",
        "The recent update made my {p} feel noticeably faster, nice work.",
        "The packaging of the {p} uses a lot of plastic, please consider alternatives.",
        "I'd love to see the {p} support more languages."],
}
DETAILS = {
    "billing": [
        "The order number is {order}.", "My bank statement shows the payment went through {date}.",
        "I have attached a screenshot of the statement.", "The amount I expected to pay was {amount2}.",
        "I paid with a Visa card ending in {last4}.", "Your checkout page said the total would be {amount2}.",
        "I'd prefer the refund to go back to the original card.",
        "My company needs the invoice to show our VAT number.",
        "Nobody replied to my previous email about this payment.", "The discount should have been {pct} percent.",
        "The billing page in my account still lists the charge as pending.",
        "I paid through PayPal if that matters.", "Please send the corrected invoice to {email}.",
        "The store assistant said refunds take five working days, but it has been longer.",
        "I can provide the transaction ID {inv} if needed.",
        "I bought it during the spring sale, so the price should have been lower."],
    "technical": [
        "I already tried a factory reset but the problem came back.",
        "The status light blinks orange three times and then goes dark.",
        "It happens on both my home network and at the office.", "I'm on firmware version {ver}.",
        "The error log says {err} just before it fails.", "Restarting my modem did not change anything.",
        "I tested with a different cable and charger with the same result.",
        "The app version on my phone is {ver2}.", "Other devices in the house work fine.",
        "It started after the last automatic update.",
        "I followed the troubleshooting guide on your website step by step.",
        "The device is still under warranty as far as I know.",
        "Sometimes it works for an hour before the problem starts again.",
        "It makes a faint buzzing noise even when it's idle.", "I can send a video of the issue if that helps.",
        "Safe mode did not help either."],
    "account": [
        "My username is {user}.", "The account was created with {email}.",
        "I checked the spam folder and there is nothing there.",
        "I no longer have access to the old phone number on file.",
        "I can confirm my identity with the serial number {serial}.",
        "The sign-in page just reloads without any message.", "I tried both the website and the mobile app.",
        "I'd like to keep my purchase history if possible.",
        "My partner set up the account originally, so the security questions aren't mine.",
        "The verification link says it has expired.", "I don't remember which email I used when I registered.",
        "My {relative} already has an account with you.", "The account settings page shows an error when I save.",
        "Please confirm by email once the change is done.", "I changed my password {date} and it worked until now."],
    "shipping": [
        "I live at {street} in {city}.", "The courier is {courier}.",
        "I was home all day and nobody rang the bell.",
        "The order confirmation said delivery in three to five days.", "I paid extra for next day delivery.",
        "The box had a torn label and water damage.", "My neighbours haven't seen the package either.",
        "The tracking page only says label created.",
        "I'll be away from {date2}, so please don't reschedule for then.",
        "The serial number on the box doesn't match the one in my order email.",
        "I still have the original packaging.", "The delivery photo shows a door that isn't mine.",
        "The order number is {order}.", "Your chat assistant told me to wait another week."],
    "feedback": [
        "I use it every day for work.", "My kids use it too and they like it.",
        "A friend recommended your brand to me.", "It would also be great to customise the notification sounds.",
        "Compared to my old device, it feels much more solid.", "The setup took less than ten minutes.",
        "I'd be happy to join a beta program.", "Maybe a small carrying case could be included.",
        "The colours on the website looked a bit different from the real thing.", "Keep up the good work.",
        "I'd also like the option to schedule updates overnight.",
        "The voice assistant sometimes misunderstands my accent.", "I posted a review on your store page as well.",
        "The instructions in the box were only in English."],
}
CONTEXT = ["I bought it {date} from your online store.", "I've had it for about {n} months now.",
            "I've been a Halcyon customer for {n} years.", "My name is {first} {last}.",
            "I'm writing from {city}.", "I got it as a birthday present.",
            "This is my first time contacting support."]
RAMBLES = ["Anyway, where was I.", "I'm not great with technology, so bear with me.",
            "My neighbour had something similar last year, I think.",
            "I read a few forum posts but they were not much help.",
            "Sorry, I know this is a long message.", "I wrote some notes down so I wouldn't forget anything.",
            "My daughter usually helps me with these things but she is away.",
            "I had to look up half of these terms online.",
            "I want to give you the full picture before you reply."]
CONNECTORS = ["Also,", "On top of that,", "Oh, and", "To be honest,", "As I said,", "Another thing:", "Then"]
GREETINGS = ["Hi,", "Hello,", "Hi there,", "Hey,", "Dear support team,", "Good morning,", "Good afternoon,",
              "Hello Halcyon team,", "Hi support,", "To whom it may concern,", "Hey team,", "Greetings,"]
SIGNOFFS = ["Thanks,\n{first}", "Thanks, {first} {last}", "Best regards,\n{first} {last}", "Cheers, {first}",
             "Kind regards, {first} {last}", "Thank you!", "Regards, {first}", "- {first}", "Many thanks, {first}"]
FIRST = ["Maria", "James", "Aisha", "Tom", "Lena", "Carlos", "Priya", "Ben", "Sofia", "Omar", "Hannah", "Kenji",
          "Grace", "Luca", "Nadia", "Peter", "Chloe", "Ravi", "Emma", "Daniel", "Yara", "Sam", "Ingrid", "Felix",
          "Zoe", "Marco", "Leila", "Victor", "Ana", "Jonas"]
LAST = ["Lopez", "Smith", "Khan", "Nguyen", "Muller", "Rossi", "Okafor", "Brown", "Silva", "Novak", "Tanaka",
         "Walsh", "Haddad", "Larsen", "Costa", "Kim", "Dubois", "Patel", "Jensen", "Moreau", "Ibrahim", "Fischer"]
CITIES = ["Leeds", "Austin", "Lyon", "Porto", "Dublin", "Denver", "Utrecht", "Melbourne", "Graz", "Toronto",
           "Bergen"]
RELATIVES = ["sister", "brother", "son", "daughter", "partner", "colleague", "father", "mother"]
COURIERS = ["SwiftPost", "ParcelLine", "Kestrel Express", "BlueVan", "RoadRunner Freight"]
DATES = ["last Tuesday", "last week", "yesterday", "two weeks ago", "at the start of the month", "over the weekend"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December"]
CASUAL = [(r"\byou\b", "u"), (r"\bplease\b", "pls"), (r"\bI'm\b", "im"), (r"\bcan't\b", "cant"),
           (r"\bdon't\b", "dont"), (r"\bthanks\b", "thx"), (r"\bbecause\b", "cuz")]
